//! An operator's action on the fleet, on record: who did what to which
//! worker, machine, job or team, when, and from where. Published on
//! [`crate::subjects::action`] (the actor's own subject: a server config
//! grants each identity its own name only) into the actions stream,
//! before the action is carried out; `minions audit` lists them.

use serde::{Deserialize, Serialize};

/// What was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// A worker was asked to finish its shards and take no more.
    Drain,
    /// A worker was told to hand its shards back and leave.
    Evict,
    /// A drained worker was told to pull again.
    Resume,
    /// A quarantined machine was released.
    Release,
    /// A job was cancelled.
    Cancel,
    /// A job's failed shards were queued again.
    Retry,
    /// A team's weight or quota was set.
    TeamSet,
    /// A machine was quarantined (by a watchdog's verdict).
    Quarantine,
}

impl ActionKind {
    /// The snake-case word (`team_set`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Drain => "drain",
            Self::Evict => "evict",
            Self::Resume => "resume",
            Self::Release => "release",
            Self::Cancel => "cancel",
            Self::Retry => "retry",
            Self::TeamSet => "team_set",
            Self::Quarantine => "quarantine",
        }
    }
}

/// One action on record. Limit: [`crate::limits::MAX_EVENT_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorAction {
    /// Schema version.
    pub v: u16,
    /// When it was asked (ms since the Unix epoch).
    pub at_ms: u64,
    /// Who: the NATS identity that published it (its subject's last token
    /// is that name's subject token), or for `via` `dashboard` the
    /// dashboard's signed-in user as the watchdog names them.
    pub by: String,
    /// From where: `cli`, `dashboard` or `watchdog`.
    pub via: String,
    /// What.
    pub action: ActionKind,
    /// On what: a worker id, machine, job id or team.
    pub target: String,
    /// More, in words (a team's new weight, a verdict's reason).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}
