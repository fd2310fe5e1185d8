use serde::{Deserialize, Serialize};

/// What a control message asks a worker to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlCommand {
    /// Finish running shards, pull nothing new.
    Drain,
    /// Hand running shards back now and pull nothing new.
    Evict,
    /// Start pulling again after a drain.
    Resume,
    /// You were declared dead: rejoin under a new worker id (a new session).
    Rejoin,
}

/// A worker's answer to a control request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlReply {
    /// Schema version.
    pub v: u16,
    /// The worker that answers.
    pub worker: crate::ids::WorkerId,
    /// What it did, in words.
    pub status: String,
    /// Shards it handed back.
    pub handed_back: u32,
}

/// A control message to one worker, on [`crate::subjects::control`].
/// Limit: [`crate::limits::MAX_CONTROL_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    /// Schema version.
    pub v: u16,
    /// The command.
    pub command: ControlCommand,
    /// Who asked, for the worker's log.
    pub by: String,
}
