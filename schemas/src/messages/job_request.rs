//! Job requests: a producer asks the watchdogs to cancel a job or retry
//! its failed shards, on a subject whose tokens name the team it acts for
//! and its name ([`crate::subjects::job_request`]). The NATS server lets an
//! identity made by `minions admin add-producer` publish there only for its
//! own teams and name, and a team's identity may neither purge the work
//! queue nor tell workers to stop a job itself, so a watchdog that acts on
//! such a request knows from the server which team asked; it acts only on
//! that team's jobs.

use serde::{Deserialize, Serialize};

use crate::ids::JobId;

/// What a [`JobRequest`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobAction {
    /// Cancel the job: mark it, drop its queued shards, stop its running ones.
    Cancel,
    /// Queue its failed shards again.
    Retry,
}

impl JobAction {
    /// The word (`cancel`, `retry`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Retry => "retry",
        }
    }
}

/// A producer's request, on [`crate::subjects::job_request`], that a
/// watchdog act on `job`. Limit: [`crate::limits::MAX_ADMISSION_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRequest {
    /// Schema version.
    pub v: u16,
    /// The job.
    pub job: JobId,
    /// What to do.
    pub action: JobAction,
}

/// A watchdog's answer to a [`JobRequest`]: done, and what was done; or
/// refused, and why. Limit: [`crate::limits::MAX_ADMISSION_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAnswer {
    /// Schema version.
    pub v: u16,
    /// Whether it was done.
    pub done: bool,
    /// What was done, or why not, in words.
    pub detail: String,
    /// The watchdog that answered.
    pub by: String,
}
