use serde::{Deserialize, Serialize};

use crate::ids::{JobId, WorkerId};
use crate::messages::WorkerState;

/// A shard a worker is running, as its heartbeat reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    /// The job.
    pub job: JobId,
    /// The shard.
    pub shard: u32,
    /// The delivery's ack subject, so a watchdog can hand it back.
    pub reply: String,
    /// When the worker started it (ms since the epoch).
    pub started_ms: u64,
}

/// A worker's periodic sign of life, on [`crate::subjects::heartbeat`].
/// Limit: [`crate::limits::MAX_HEARTBEAT_BYTES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Schema version.
    pub v: u16,
    /// The worker.
    pub worker: WorkerId,
    /// Host name.
    pub host: String,
    /// The compute device, e.g. `cpu`, `metal:0`, `cuda:0`.
    pub device: String,
    /// Concurrent shard slots.
    pub slots: u32,
    /// The most shards it holds at once: its slots, and the extra pulls
    /// that shards joining its running generation batch may make (0 from
    /// workers that predate it: read as `slots`).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub holds: u32,
    /// Whether the worker is draining (finishing, pulling nothing new).
    pub draining: bool,
    /// Whether this is the worker's last beat (it stopped cleanly and handed
    /// back what it did not finish).
    pub leaving: bool,
    /// Whether the machine's owner lets the worker run (`available`) or not,
    /// and why.
    pub owner: String,
    /// Total memory of the machine, MB (0 when unknown).
    pub mem_total_mb: u64,
    /// Available memory of the machine, MB (0 when unknown).
    pub mem_avail_mb: u64,
    /// The most memory the owner lets models use, MB (0 when unlimited or
    /// unknown). A model larger than this is handed to another machine.
    #[serde(default)]
    pub mem_budget_mb: u64,
    /// Shards running now.
    pub in_flight: Vec<InFlight>,
    /// Shards finished since start.
    pub done: u64,
    /// Shard deliveries that failed since start.
    pub failed: u64,
    /// Heartbeat interval, ms (a watchdog counts missed beats with it).
    pub interval_ms: u64,
    /// When the worker started (ms since the epoch).
    pub started_ms: u64,
    /// When this beat was sent (ms since the epoch).
    pub at_ms: u64,
    /// The machine's power and energy as the worker reads or estimates it
    /// (absent in older beats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerReading>,
    /// The chip that runs shards: the GPU's name on CUDA, else the CPU's
    /// (e.g. `Apple M2 Pro`); empty when unknown (and in older beats).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub chip: String,
    /// The memory the worker lends to models, MB: what it schedules by
    /// (0 when unknown, and in older beats).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lend_mb: u64,
    /// The worker build, as [`super::Provenance::build`] gives it (empty in
    /// older beats).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub build: String,
    /// The CPU kernel path the worker takes (empty in older beats).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel: String,
    /// The stage of a group it holds, if any (absent in older beats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<super::HeldStage>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A machine's power draw and energy since the worker started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PowerReading {
    /// Mean power over the last sampling interval, watts.
    pub watts: f64,
    /// Energy since the worker started, joules.
    pub joules: f64,
    /// True when read from a meter; false when estimated.
    pub measured: bool,
    /// Where it comes from: `rapl`, `nvidia-smi`, `powermetrics`,
    /// `estimate`.
    pub source: String,
}

impl Heartbeat {
    /// The most shards the worker holds at once ([`Heartbeat::holds`], or
    /// its slots for workers that do not say).
    pub fn holds_at_most(&self) -> u32 {
        self.holds.max(self.slots)
    }

    /// The state this beat shows: left, draining, busy or idle. (Silence,
    /// suspicion and death are for the watchdog to judge.)
    pub fn state(&self) -> WorkerState {
        if self.leaving {
            WorkerState::Left
        } else if self.draining {
            WorkerState::Draining
        } else if self.in_flight.is_empty() {
            WorkerState::Idle
        } else {
            WorkerState::Busy
        }
    }
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}
