//! The canary's messages: a worker's answer to the known shard and the
//! watchdog's verdict on it (see [`crate::canary`]).

use serde::{Deserialize, Serialize};

use super::{Precision, Provenance};

/// The canary's embeddings at one precision: `rows` vectors of `dim`, one
/// per canary text, in order. The speech canary's answer has the same
/// shape: one row of `dim` logits per decoder step (see
/// [`crate::canary::SPEECH_STEPS`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryAnswer {
    /// The precision the canary model ran at.
    pub precision: Precision,
    /// The embedding dimension.
    pub dim: u32,
    /// The vectors, row after row (`texts × dim` values).
    pub data: Vec<f32>,
}

/// What a worker sends on [`crate::subjects::canary`] before it pulls any
/// work: who it is, what made its answers, and the answers.
/// Limit: [`crate::limits::MAX_CANARY_BYTES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryReport {
    /// Schema version.
    pub v: u16,
    /// The worker that ran the canary.
    pub worker: String,
    /// Its build, device and kernel path.
    pub made_by: Provenance,
    /// One answer per precision the worker runs.
    pub answers: Vec<CanaryAnswer>,
    /// The speech canary's answer (a tiny Whisper's logits); absent from
    /// the reports of workers built before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speech: Option<CanaryAnswer>,
}

/// A watchdog's reply to a [`CanaryReport`]. A worker that failed pulls
/// nothing; the watchdog has quarantined its machine.
/// Limit: [`crate::limits::MAX_CANARY_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanaryVerdict {
    /// Schema version.
    pub v: u16,
    /// Whether every answer matched the known one.
    pub passed: bool,
    /// How close the answers came, or the first that did not.
    pub detail: String,
    /// The watchdog that judged.
    pub by: String,
}
