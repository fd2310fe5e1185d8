//! Passes and replies as they travel: encoded, cut into checksummed parts
//! ([`minions_schemas::stage_frames`]) and put together again, for both
//! ends of a link between stages. The transport (NATS, a channel in tests)
//! only moves the parts.

use minions_schemas::limits::MAX_STAGE_PASS_BYTES;
use minions_schemas::messages::{StagePass, StageReply};
use minions_schemas::stage_frames::{Assembler, FrameError, cut};
use minions_schemas::{SCHEMA_VERSION, decode, encode};

use super::stage::{StageAnswer, StageRefusal, StageServer};
use crate::ModelError;

/// The parts of `pass`, to send in order.
pub fn pass_parts(pass: &StagePass) -> Result<Vec<Vec<u8>>, ModelError> {
    let bytes = encode("stage pass", pass).map_err(wire)?;
    cut(pass.epoch, pass.pass, &bytes).map_err(wire)
}

/// The parts of `reply`, to send in order.
pub fn reply_parts(reply: &StageReply) -> Result<Vec<Vec<u8>>, ModelError> {
    let bytes = encode("stage reply", reply).map_err(wire)?;
    cut(reply.epoch, reply.pass, &bytes).map_err(wire)
}

fn wire(e: impl std::fmt::Display) -> ModelError {
    ModelError::StageLost(format!("a stage frame: {e}"))
}

/// The first stage's end: the last stage's replies put together.
#[derive(Debug, Default)]
pub struct ReplyReader {
    parts: Assembler,
}

impl ReplyReader {
    /// Takes one part; returns the reply when it is whole. A garbled or
    /// misplaced part is an error: the reply is lost and the epoch ends.
    pub fn take(&mut self, wire_part: &[u8]) -> Result<Option<StageReply>, ModelError> {
        match self.parts.push(wire_part).map_err(wire)? {
            None => Ok(None),
            Some((_, _, bytes)) => Ok(Some(
                decode("stage reply", &bytes, MAX_STAGE_PASS_BYTES).map_err(wire)?,
            )),
        }
    }
}

/// Where a stage sends what it made of a pass.
#[derive(Debug)]
pub enum Outgoing {
    /// To the next stage: a pass's parts.
    Next(Vec<Vec<u8>>),
    /// To the first stage: a reply's parts (an answer, or a refusal).
    First(Vec<Vec<u8>>),
}

/// What a stage did with one part from the wire.
#[derive(Debug)]
pub enum Taken {
    /// The pass is not whole yet.
    Partial,
    /// A pass ran (or was refused, and the refusal is sent back).
    Send(Outgoing),
    /// A part or pass was refused with nothing to answer (stale, of an
    /// older epoch): the first stage has moved on.
    Dropped(String),
}

/// A later stage's end of its links: parts in, parts out.
pub struct StageEnd {
    server: StageServer,
    parts: Assembler,
    /// Which stage this is, for refusals (1 for the second).
    index: usize,
    /// How fast it runs its layers.
    pace: std::sync::Arc<super::pace::Pace>,
}

impl StageEnd {
    /// The wire end of `server`, stage number `index` of its group (from
    /// 0, the first stage).
    pub fn new(server: StageServer, index: usize) -> Self {
        Self {
            server,
            parts: Assembler::default(),
            index,
            pace: Default::default(),
        }
    }

    /// How fast this stage runs its layers, shared (for the heartbeat).
    pub fn pace(&self) -> std::sync::Arc<super::pace::Pace> {
        self.pace.clone()
    }

    /// The stage behind it.
    pub fn server(&self) -> &StageServer {
        &self.server
    }

    /// Takes one part from the previous stage.
    pub fn take(&mut self, wire_part: &[u8]) -> Result<Taken, ModelError> {
        let (epoch, pass, bytes) = match self.parts.push(wire_part) {
            Ok(None) => return Ok(Taken::Partial),
            Ok(Some(whole)) => whole,
            Err(e) => {
                let (epoch, pass) = match &e {
                    FrameError::Garbled { epoch, pass, .. }
                    | FrameError::OutOfOrder { epoch, pass, .. }
                    | FrameError::BadSize { epoch, pass, .. } => (*epoch, *pass),
                    FrameError::Codec(_) => (self.server.epoch(), u64::MAX),
                };
                return self.refuse(epoch, pass, e.to_string());
            }
        };
        let decoded: Result<StagePass, _> = decode("stage pass", &bytes, MAX_STAGE_PASS_BYTES);
        let p = match decoded {
            Ok(p) => p,
            Err(e) => return self.refuse(epoch, pass, e.to_string()),
        };
        let (rows, started) = (p.rows(), std::time::Instant::now());
        let ran = self.server.run(p);
        if ran.is_ok() {
            self.pace
                .record(started.elapsed(), self.server.layers().len(), rows);
        }
        match ran {
            Ok(StageAnswer::Forward(next)) => Ok(Taken::Send(Outgoing::Next(pass_parts(&next)?))),
            Ok(StageAnswer::Reply(reply)) => Ok(Taken::Send(Outgoing::First(reply_parts(&reply)?))),
            Err(r @ StageRefusal::Stale { .. }) => Ok(Taken::Dropped(r.to_string())),
            Err(r) => self.refuse(epoch, pass, r.to_string()),
        }
    }

    /// Answers the first stage that pass `pass` was refused, unless it is
    /// of an older epoch than the stage's.
    fn refuse(&self, epoch: u64, pass: u64, why: String) -> Result<Taken, ModelError> {
        if epoch < self.server.epoch() {
            return Ok(Taken::Dropped(why));
        }
        let reply = StageReply {
            v: SCHEMA_VERSION,
            group: String::new(),
            epoch,
            pass,
            micro: 0,
            tokens: Vec::new(),
            error: Some(format!(
                "stage {} (layers {:?}): {why}",
                self.index,
                self.server.layers()
            )),
        };
        Ok(Taken::Send(Outgoing::First(reply_parts(&reply)?)))
    }
}
