//! A stage after the first in a split model: it holds a range of layers and
//! those layers' caches for the group's sequences, runs each
//! [`StagePass`] through them and hands the hidden states on, or, holding
//! the head, samples and answers the first stage.
//!
//! It refuses, before touching a cache, a pass of another group, of an
//! older epoch, numbered at or below one it has run (stale or replayed), or
//! whose steps do not continue its caches (a step must start where the
//! sequence's cache ends, and only a new sequence may open, at 0 or where
//! the shared prefix it copies ends). A pass of a newer epoch drops every
//! cache first: the group's membership changed and the first stage reads
//! its sequences again from their prompts.

use std::collections::HashMap;

use candle_core::Tensor;
use minions_schemas::SCHEMA_VERSION;
use minions_schemas::messages::{StagePass, StageReply};

use super::llama::{KvCache, Llama, StageOut, Step};
use super::sampler::Sampler;
use crate::ModelError;

/// What a stage does with a pass it ran.
#[derive(Debug)]
pub enum StageAnswer {
    /// Hand it on to the next stage.
    Forward(StagePass),
    /// Answer the first stage (the stage holds the head).
    Reply(StageReply),
}

/// Why a stage refused a pass.
#[derive(Debug, thiserror::Error)]
pub enum StageRefusal {
    /// The pass is older than what the stage has run: an earlier epoch, or
    /// a pass number already seen. Nothing to answer; the first stage has
    /// moved on.
    #[error(
        "stale pass {pass} of epoch {epoch}: this stage is at pass {at_pass:?} of epoch {at_epoch}"
    )]
    Stale {
        /// The pass's epoch.
        epoch: u64,
        /// Its number.
        pass: u64,
        /// The stage's epoch.
        at_epoch: u64,
        /// The last pass it ran in that epoch.
        at_pass: Option<u64>,
    },
    /// The pass does not fit this stage's state: another group, a step
    /// that does not continue its cache, hidden states of the wrong size.
    #[error("pass {pass} of epoch {epoch} refused: {reason}")]
    Mismatch {
        /// The pass's epoch.
        epoch: u64,
        /// Its number.
        pass: u64,
        /// What is wrong.
        reason: String,
    },
    /// The pass was accepted but running it failed.
    #[error(transparent)]
    Model(#[from] ModelError),
}

struct Seq {
    cache: KvCache,
    /// The last stage's chooser.
    sampler: Option<Sampler>,
}

/// One stage's layers and its sequences' caches, for one group.
pub struct StageServer {
    model: Llama,
    group: String,
    epoch: u64,
    last_pass: Option<u64>,
    seqs: HashMap<u64, Seq>,
}

impl StageServer {
    /// Serves `model` (a stage that does not hold the embeddings) to
    /// `group`.
    pub fn new(model: Llama, group: &str) -> Result<Self, ModelError> {
        if model.layers().start == 0 {
            return Err(ModelError::Invalid {
                family: "llm-generation",
                reason: "the first stage drives the group; it is not served".into(),
            });
        }
        Ok(Self {
            model,
            group: group.to_owned(),
            epoch: 0,
            last_pass: None,
            seqs: HashMap::new(),
        })
    }

    /// The layers served.
    pub fn layers(&self) -> std::ops::Range<usize> {
        self.model.layers()
    }

    /// Whether this stage samples (holds the head).
    pub fn is_last(&self) -> bool {
        self.model.layers().end == self.model.config().layers
    }

    /// Sequences whose caches it holds.
    pub fn sequences(&self) -> usize {
        self.seqs.len()
    }

    /// The epoch it is in.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Why sequence `seq` may not open on the first `start` positions of
    /// sequence `prefix`'s cache, if it may not.
    fn check_prefix(&self, seq: u64, prefix: u64, start: u32) -> Result<(), String> {
        if !self.model.reads_in_parts_exactly() {
            return Err(format!(
                "sequence {seq} opens on a shared prefix; this stage's kernels do not read a \
                 prompt in parts with the same bits as whole"
            ));
        }
        match self.seqs.get(&prefix) {
            _ if start == 0 => Err(format!(
                "sequence {seq} opens on sequence {prefix} but copies none of it (it starts at 0)"
            )),
            Some(q) if q.cache.len() >= start as usize => Ok(()),
            Some(q) => Err(format!(
                "sequence {seq} opens on {start} positions of sequence {prefix}, whose cache here \
                 holds {}",
                q.cache.len()
            )),
            None => Err(format!(
                "sequence {seq} opens on sequence {prefix}, which is unknown here"
            )),
        }
    }

    /// Runs `pass`; see the module's rules for what is refused.
    pub fn run(&mut self, pass: StagePass) -> Result<StageAnswer, StageRefusal> {
        let mismatch = |reason: String| StageRefusal::Mismatch {
            epoch: pass.epoch,
            pass: pass.pass,
            reason,
        };
        if pass.group != self.group {
            return Err(mismatch(format!(
                "it is for group {:?}; this stage serves {:?}",
                pass.group, self.group
            )));
        }
        if pass.epoch < self.epoch
            || (pass.epoch == self.epoch && self.last_pass.is_some_and(|p| pass.pass <= p))
        {
            return Err(StageRefusal::Stale {
                epoch: pass.epoch,
                pass: pass.pass,
                at_epoch: self.epoch,
                at_pass: self.last_pass,
            });
        }
        if pass.epoch > self.epoch {
            self.seqs.clear();
            self.epoch = pass.epoch;
            self.last_pass = None;
        }
        self.last_pass = Some(pass.pass);
        for id in &pass.ended {
            self.seqs.remove(id);
        }
        let last = self.is_last();
        let cfg = self.model.config();
        if pass.width as usize != cfg.hidden {
            return Err(mismatch(format!(
                "rows of {} values; the model's are {}",
                pass.width, cfg.hidden
            )));
        }
        let hidden = pass.hidden_f32().map_err(&mismatch)?;
        // Every step checked before any cache changes.
        let mut seen = std::collections::HashSet::new();
        for s in &pass.steps {
            if !seen.insert(s.seq) {
                return Err(mismatch(format!("sequence {} stepped twice", s.seq)));
            }
            if s.tokens == 0 {
                return Err(mismatch(format!("sequence {} stepped by no token", s.seq)));
            }
            match (self.seqs.get(&s.seq), &s.open) {
                (Some(q), None) if q.cache.len() == s.start as usize => {}
                (Some(q), None) => {
                    return Err(mismatch(format!(
                        "sequence {} steps from position {}; its cache here holds {}",
                        s.seq,
                        s.start,
                        q.cache.len()
                    )));
                }
                (Some(_), Some(_)) => {
                    return Err(mismatch(format!("sequence {} opened twice", s.seq)));
                }
                (None, Some(open)) if s.start == 0 || open.prefix_of.is_some() => {
                    if open.shared && !self.model.reads_in_parts_exactly() {
                        return Err(mismatch(format!(
                            "sequence {} is a prefix to share; this stage's kernels do not read \
                             a prompt in parts with the same bits as whole",
                            s.seq
                        )));
                    }
                    if let Some(p) = open.prefix_of {
                        self.check_prefix(s.seq, p, s.start).map_err(&mismatch)?;
                    }
                    if u64::from(s.start) + u64::from(s.tokens) > u64::from(open.capacity) {
                        return Err(mismatch(format!(
                            "sequence {} reads {} tokens from position {} into a cache of {}",
                            s.seq, s.tokens, s.start, open.capacity
                        )));
                    }
                }
                (None, _) => {
                    return Err(mismatch(format!(
                        "sequence {} is unknown here (position {}, opened: {})",
                        s.seq,
                        s.start,
                        s.open.is_some()
                    )));
                }
            }
        }
        for s in &pass.steps {
            if let Some(open) = &s.open {
                let mut cache = self.model.new_cache(open.capacity as usize)?;
                if let Some(from) = open.prefix_of.and_then(|p| self.seqs.get(&p)) {
                    self.model
                        .copy_prefix(&mut cache, &from.cache, s.start as usize)?;
                }
                let sampler = last.then(|| Sampler::new(&open.params));
                self.seqs.insert(s.seq, Seq { cache, sampler });
            }
        }
        let out = if pass.steps.is_empty() {
            None
        } else {
            let rows = pass.rows() as usize;
            let hidden = Tensor::from_vec(hidden, (rows, cfg.hidden), self.model.device())
                .map_err(ModelError::from)?;
            let dummy: Vec<Vec<u32>> = pass
                .steps
                .iter()
                .map(|s| vec![0; s.tokens as usize])
                .collect();
            let mut caches: HashMap<u64, &mut Seq> =
                self.seqs.iter_mut().map(|(k, v)| (*k, v)).collect();
            let mut steps = Vec::with_capacity(pass.steps.len());
            let mut samplers = Vec::new();
            for (s, tokens) in pass.steps.iter().zip(&dummy) {
                let Some(q) = caches.remove(&s.seq) else {
                    return Err(mismatch(format!("sequence {} lost its cache", s.seq)));
                };
                let Seq { cache, sampler } = q;
                if s.sample {
                    samplers.push(sampler);
                }
                steps.push(Step { cache, tokens });
            }
            let out = self.model.forward_stage(&mut steps, Some(&hidden), false)?;
            Some((out, samplers))
        };
        let mut tokens = Vec::new();
        let answer = match out {
            None if last => None,
            None => Some(Vec::new()),
            Some((StageOut::Hidden(h), _)) => Some(
                h.flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(ModelError::from)?,
            ),
            Some((StageOut::Logits(l), samplers)) => {
                let mut samplers = samplers.into_iter();
                for (row, s) in pass.steps.iter().enumerate() {
                    if s.sample {
                        let Some(Some(sampler)) = samplers.next() else {
                            return Err(mismatch("a sampled step without a sampler".into()));
                        };
                        tokens.push(sampler.next(&Llama::row(&l, row)?)?);
                    }
                }
                None
            }
        };
        Ok(match answer {
            Some(values) => StageAnswer::Forward(StagePass {
                hidden: StagePass::hidden_bytes(&values),
                ..pass
            }),
            None => StageAnswer::Reply(StageReply {
                v: SCHEMA_VERSION,
                group: pass.group,
                epoch: pass.epoch,
                pass: pass.pass,
                micro: pass.micro,
                tokens,
                error: None,
            }),
        })
    }
}
