use serde::{Deserialize, Serialize};

use crate::ids::{JobId, ModelHash};

/// A job's priority within its team: higher runs first; equal priority runs
/// oldest first. Across teams, fair share decides (see
/// [`crate::scheduling`]).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Runs when the team has nothing more urgent.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Runs before the team's normal and low jobs.
    High,
}

impl Priority {
    /// The lowercase name (`low`, `normal`, `high`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Normal => "normal",
            Self::High => "high",
        }
    }

    /// Parses a lowercase name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "low" => Some(Self::Low),
            "normal" => Some(Self::Normal),
            "high" => Some(Self::High),
            _ => None,
        }
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a job needs from a worker: it is pulled only by workers that lend at
/// least this.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirements {
    /// Memory for weights plus activations or KV cache, MB (0 = any worker).
    pub memory_mb: u64,
    /// Device kinds it may run on (`cpu`, `cuda`, `metal`); empty = any.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Stages a generation job runs as (a model split by layers over a
    /// group of this many workers); 0 or 1: one worker holds the whole
    /// model. Only a group's first stage, assigned to the job, pulls it.
    #[serde(default)]
    pub stages: u32,
}

impl Requirements {
    /// Whether a worker lending `memory_mb` (0 = unknown, taken as enough)
    /// on `device` (e.g. `cuda:0`) can run the job alone (never one that
    /// runs on a group).
    pub fn met_by(&self, memory_mb: u64, device: &str) -> bool {
        if self.stages > 1 {
            return false;
        }
        let kind = device.split(':').next().unwrap_or(device);
        let mem_ok = self.memory_mb == 0 || memory_mb == 0 || memory_mb >= self.memory_mb;
        let dev_ok = self.devices.is_empty() || self.devices.iter().any(|d| d == kind);
        mem_ok && dev_ok
    }

    /// Whether any of `lenders` (memory lent in MB, device) can run the
    /// job alone ([`Requirements::met_by`]).
    pub fn met_by_any(&self, lenders: &[(u64, String)]) -> bool {
        lenders.iter().any(|(mb, dev)| self.met_by(*mb, dev))
    }
}

/// A team's standing in the fleet's policy, stored in the teams bucket
/// ([`crate::streams::TEAMS_BUCKET`], key = team). Teams without a record
/// have weight 1 and no quota.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeamPolicy {
    /// Schema version.
    pub v: u16,
    /// Relative share of the fleet's slots when several teams have work
    /// (> 0; default 1).
    pub weight: f64,
    /// Most slots the team's jobs may hold at once (0 = no cap).
    pub quota: u32,
}

impl Default for TeamPolicy {
    fn default() -> Self {
        Self {
            v: crate::SCHEMA_VERSION,
            weight: 1.0,
            quota: 0,
        }
    }
}

/// One job with work queued, as the schedule lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuedJob {
    /// The job.
    pub job: JobId,
    /// Its team.
    pub team: String,
    /// Its priority within the team.
    pub priority: Priority,
    /// Whether its shards yield their slots to other work.
    pub preemptible: bool,
    /// What a worker must lend to run it.
    pub needs: Requirements,
    /// The model it runs (workers prefer jobs whose model they hold).
    pub model_hash: ModelHash,
    /// When it was submitted (ms since the epoch): oldest first.
    pub created_ms: u64,
    /// Shards not yet delivered.
    pub pending: u64,
    /// Shards delivered and not yet acknowledged (running, or waiting to be
    /// redelivered).
    pub running: u64,
    /// Check runs on the job's check consumer, which workers pull first:
    /// queued (part of `pending`) or out (part of `running`, a handed-back
    /// one waiting to be redelivered among them); absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checks: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A team in the schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeamShare {
    /// The team.
    pub team: String,
    /// Its weight.
    pub weight: f64,
    /// Its slot cap (0 = none).
    pub quota: u32,
    /// Its recent usage: slots in use, averaged with the fleet's usage
    /// half-life (0 when no watchdog measures it).
    pub usage: f64,
}

impl TeamShare {
    /// The team's claim on slots: weight discounted by recent usage,
    /// `weight / (1 + usage)`. Slots go to the team with the fewest running
    /// shards per unit of claim.
    pub fn claim(&self) -> f64 {
        let w = if self.weight.is_finite() && self.weight > 0.0 {
            self.weight
        } else {
            1.0
        };
        w / (1.0 + self.usage.max(0.0))
    }
}

/// What is queued, team by team: published by the watchdog on
/// [`crate::subjects::SCHEDULE`] a few times a second; workers choose what
/// to pull from it. Limit: [`crate::limits::MAX_SCHEDULE_BYTES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Schema version.
    pub v: u16,
    /// When it was read (ms since the epoch).
    pub at_ms: u64,
    /// Jobs with shards queued or running, any order.
    pub jobs: Vec<QueuedJob>,
    /// Teams with a policy or with jobs.
    pub teams: Vec<TeamShare>,
    /// Preemption: the fraction (0..=1) of running preemptible shards that
    /// should yield now, because non-preemptible work has waited a full
    /// schedule period. Each worker yields each of its preemptible shards
    /// with this probability.
    #[serde(default)]
    pub preempt: f64,
    /// Free slots of live, lending workers fleet-wide (0 when unknown):
    /// they pick as soon as this schedule arrives.
    #[serde(default)]
    pub idle: u64,
}
