use serde::{Deserialize, Serialize};

use crate::ids::WorkerId;

/// Where a worker stands, as the watchdog's registry records it.
///
/// `Joining → Idle/Busy → Draining → Suspect → Dead`. `Dead` is final for
/// that worker id: a worker that comes back after being declared dead rejoins
/// under a new id (a new session), so nothing it held is trusted again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// First heartbeat seen.
    Joining,
    /// Alive, no shard running.
    Idle,
    /// Alive, running shards.
    Busy,
    /// Finishing its shards, pulling nothing new.
    Draining,
    /// Missed heartbeats; not yet declared dead.
    Suspect,
    /// Declared dead; its shards were handed back.
    Dead,
    /// Stopped cleanly.
    Left,
}

impl WorkerState {
    /// The state as a word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Joining => "joining",
            Self::Idle => "idle",
            Self::Busy => "busy",
            Self::Draining => "draining",
            Self::Suspect => "suspect",
            Self::Dead => "dead",
            Self::Left => "left",
        }
    }

    /// True for states a worker never leaves under the same id.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Dead | Self::Left)
    }
}

/// A worker's entry in the registry (JetStream KV, key = worker id). Written
/// with compare-and-set on every state change, so when several watchdogs run
/// only one of them performs each transition (and its hand-back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Schema version.
    pub v: u16,
    /// The worker.
    pub worker: WorkerId,
    /// Host name.
    pub host: String,
    /// Compute device.
    pub device: String,
    /// Current state.
    pub state: WorkerState,
    /// Why it is in this state (e.g. "missed 3 heartbeats").
    pub reason: String,
    /// Shards handed back when it was declared dead or evicted.
    pub handed_back: u32,
    /// When the state last changed (ms since the epoch).
    pub changed_ms: u64,
    /// Which watchdog wrote this state.
    pub by: String,
}
