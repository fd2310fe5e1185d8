//! Stages of a split model: what goes from one stage of a group to the
//! next, and what the last stage sends back to the first.
//!
//! A group runs one language model as stages of consecutive layers. The
//! first stage schedules the batch: for each micro-batch group it reads its
//! own layers, then sends a [`StagePass`] with the hidden states to the
//! next stage, which reads its layers and sends the pass on; the stage that
//! holds the head samples a token for every step that asks for one and
//! answers the first stage with a [`StageReply`]. Passes are numbered
//! within an epoch (the group's membership); a stage refuses a pass of
//! another group, of an older epoch, numbered at or below one it has run,
//! or whose steps do not continue its caches, so a stale or replayed pass
//! never becomes output. On the wire a pass travels in
//! [`crate::stage_frames`]' checksummed parts.

use serde::{Deserialize, Serialize};

use super::SamplingParams;

/// A sequence a stage has not seen before: the cache it may hold and, for
/// the stage that samples, how to sample it (its seed included, so a rerun
/// from the prompt draws the same tokens).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageOpen {
    /// Tokens the sequence may hold (prompt and output).
    pub capacity: u32,
    /// How the last stage samples it.
    pub params: SamplingParams,
    /// The sequence whose cache's first `start` positions this one's cache
    /// begins with, copied before the step (a prompt prefix read once for
    /// several sequences); none when the step starts at 0. Left out on the
    /// wire when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_of: Option<u64>,
    /// Other sequences will open on this one's cache (it is a shared
    /// prompt prefix): a stage whose kernels do not read a prompt in parts
    /// with the same bits as whole refuses it. Left out on the wire when
    /// false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

/// One sequence's part of a pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageStep {
    /// The sequence, unique within the epoch.
    pub seq: u64,
    /// The cache position of its first new token: what the stage's cache
    /// must hold already.
    pub start: u32,
    /// New tokens, that is rows of the hidden states.
    pub tokens: u32,
    /// Whether the last stage samples a token after this step (false for a
    /// prompt chunk that is not the prompt's last).
    pub sample: bool,
    /// Present on the sequence's first step; that step starts at 0, or
    /// where the prefix it copies ends.
    pub open: Option<StageOpen>,
}

/// One forward pass of a micro-batch group, from one stage to the next.
/// Limit (assembled): [`crate::limits::MAX_STAGE_PASS_BYTES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagePass {
    /// Schema version.
    pub v: u16,
    /// The group.
    pub group: String,
    /// The group's membership epoch; a new one drops every cache.
    pub epoch: u64,
    /// The pass's number within the epoch, increasing.
    pub pass: u64,
    /// The micro-batch group it belongs to.
    pub micro: u32,
    /// Sequences that ended: their caches are dropped before this pass.
    pub ended: Vec<u64>,
    /// The sequences stepped, in the order of the hidden states' rows.
    pub steps: Vec<StageStep>,
    /// Values per row.
    pub width: u32,
    /// The hidden states, `[rows, width]` little-endian f32, rows being the
    /// steps' tokens in order.
    #[serde(with = "serde_bytes")]
    pub hidden: Vec<u8>,
}

impl StagePass {
    /// Rows the steps add up to.
    pub fn rows(&self) -> u64 {
        self.steps.iter().map(|s| u64::from(s.tokens)).sum()
    }

    /// The hidden states as f32, checked against the steps and the width.
    pub fn hidden_f32(&self) -> Result<Vec<f32>, String> {
        let want = self.rows() * u64::from(self.width) * 4;
        if self.hidden.len() as u64 != want {
            return Err(format!(
                "pass {} carries {} bytes of hidden states; {} rows of {} values are {want}",
                self.pass,
                self.hidden.len(),
                self.rows(),
                self.width
            ));
        }
        Ok(self
            .hidden
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Little-endian bytes of `values`, for [`StagePass::hidden`].
    pub fn hidden_bytes(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(values.len() * 4);
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }
}

/// The last stage's answer to a pass, to the first stage.
/// Limit: [`crate::limits::MAX_STAGE_PASS_BYTES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageReply {
    /// Schema version.
    pub v: u16,
    /// The group.
    pub group: String,
    /// The epoch of the pass answered.
    pub epoch: u64,
    /// The pass answered.
    pub pass: u64,
    /// Its micro-batch group.
    pub micro: u32,
    /// One token per step that asked for one, in the pass's order.
    pub tokens: Vec<u32>,
    /// Set when a stage refused or failed the pass: which stage and why.
    /// The first stage ends the epoch.
    pub error: Option<String>,
}
