//! The first stage's link to the others over NATS: passes go to the
//! second stage's subject in parts, and the last stage's replies come
//! back on this worker's own. The generation loop runs on a blocking
//! thread; this link bridges it to the async client.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use minions_schemas::messages::{StagePass, StageReply};
use tokio_util::sync::CancellationToken;

use crate::model::ModelError;
use crate::model::llm::pipeline::StageLink;
use crate::model::llm::stage_wire::{ReplyReader, pass_parts};

/// How long the first stage waits for a reply before it takes the group
/// as broken.
pub(crate) const REPLY_WAIT: Duration = Duration::from_secs(30);

/// How often a wait looks at the run's stop flag (a shard handed back
/// stops within this).
const POLL: Duration = Duration::from_millis(100);

/// What reaches the first stage's generation loop.
pub(crate) enum LinkMsg {
    /// A part of a reply.
    Part(Bytes),
    /// The group was re-formed: its new epoch and second stage.
    Regroup {
        /// The watchdog's epoch.
        epoch: u64,
        /// The second stage's subject.
        next: String,
    },
}

/// A [`StageLink`] over NATS.
pub(crate) struct NatsLink {
    client: async_nats::Client,
    runtime: tokio::runtime::Handle,
    /// The second stage's subject.
    next: String,
    replies: mpsc::Receiver<LinkMsg>,
    reader: ReplyReader,
    /// A re-formed group's epoch, not yet begun.
    regrouped: Option<u64>,
    /// The group was let go: nothing more comes.
    closed: bool,
}

impl NatsLink {
    /// Listens on `back` for replies (until `stop`) and sends passes to
    /// `next`; returns it and the way to tell it of a re-formed group. Call
    /// from the async runtime.
    pub(crate) async fn open(
        client: async_nats::Client,
        next: String,
        back: String,
        stop: CancellationToken,
    ) -> Result<(Self, mpsc::Sender<LinkMsg>), ModelError> {
        let mut sub = client
            .subscribe(back)
            .await
            .map_err(|e| ModelError::StageLost(format!("listening for replies: {e}")))?;
        // The subscription is on the server before any pass goes out.
        client
            .flush()
            .await
            .map_err(|e| ModelError::StageLost(format!("listening for replies: {e}")))?;
        let (tx, replies) = mpsc::channel();
        let regroup = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    m = sub.next() => match m {
                        Some(m) => {
                            if tx.send(LinkMsg::Part(m.payload)).is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
        });
        let link = Self {
            client,
            runtime: tokio::runtime::Handle::current(),
            next,
            replies,
            reader: ReplyReader::default(),
            regrouped: None,
            closed: false,
        };
        Ok((link, regroup))
    }

    /// Whether the group was let go (this worker no longer leads it).
    pub(crate) fn closed(&self) -> bool {
        self.closed
    }

    /// The epoch of a re-formed group, when one came already or comes
    /// within `wait` (sooner nothing once `stop` is set or the group was
    /// let go); reply parts meanwhile are of the old epoch and dropped.
    pub(crate) fn regrouped(&mut self, wait: Duration, stop: &AtomicBool) -> Option<u64> {
        if let Some(e) = self.regrouped.take() {
            return Some(e);
        }
        let until = std::time::Instant::now() + wait;
        loop {
            match self.next_msg(until, stop) {
                Waited::Msg(LinkMsg::Regroup { epoch, next }) => {
                    self.regroup_to(next);
                    return Some(epoch);
                }
                Waited::Msg(LinkMsg::Part(_)) => {}
                Waited::TimedOut | Waited::Stopped | Waited::Closed => return None,
            }
        }
    }

    /// Points passes at a re-formed group's second stage.
    fn regroup_to(&mut self, next: String) {
        self.next = next;
        self.reader = ReplyReader::default();
    }

    /// The next message before `until`, looking at `stop` every
    /// [`POLL`] (a shard handed back stops within it).
    fn next_msg(&mut self, until: std::time::Instant, stop: &AtomicBool) -> Waited {
        loop {
            if stop.load(Ordering::Relaxed) {
                return Waited::Stopped;
            }
            let left = until.saturating_duration_since(std::time::Instant::now());
            match self.replies.recv_timeout(left.min(POLL)) {
                Ok(m) => return Waited::Msg(m),
                Err(mpsc::RecvTimeoutError::Timeout) if left <= POLL => return Waited::TimedOut,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.closed = true;
                    return Waited::Closed;
                }
            }
        }
    }
}

/// What a wait on the link's messages came to.
enum Waited {
    Msg(LinkMsg),
    TimedOut,
    Stopped,
    Closed,
}

impl StageLink for NatsLink {
    fn send(&mut self, pass: StagePass) -> Result<(), ModelError> {
        let parts = pass_parts(&pass)?;
        let (client, next) = (&self.client, &self.next);
        self.runtime.block_on(async {
            for p in parts {
                client.publish(next.clone(), p.into()).await.map_err(|e| {
                    ModelError::StageLost(format!("sending pass {}: {e}", pass.pass))
                })?;
            }
            Ok(())
        })
    }

    fn recv(&mut self, stop: &AtomicBool) -> Result<StageReply, ModelError> {
        let until = std::time::Instant::now() + REPLY_WAIT;
        loop {
            match self.next_msg(until, stop) {
                Waited::Msg(LinkMsg::Part(part)) => {
                    if let Some(r) = self.reader.take(&part)? {
                        return Ok(r);
                    }
                }
                Waited::Msg(LinkMsg::Regroup { epoch, next }) => {
                    self.regroup_to(next);
                    self.regrouped = Some(epoch);
                    return Err(ModelError::StageLost(format!(
                        "the group was re-formed (epoch {epoch})"
                    )));
                }
                Waited::Stopped => return Err(ModelError::StageLost("stopped".into())),
                Waited::Closed => {
                    return Err(ModelError::StageLost("the group was let go".into()));
                }
                Waited::TimedOut => {
                    return Err(ModelError::StageLost(format!(
                        "no reply from the last stage in {} s",
                        REPLY_WAIT.as_secs()
                    )));
                }
            }
        }
    }
}
