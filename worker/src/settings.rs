//! How this worker runs shards: fixed at start from its configuration and
//! the work stream's settings, read by every slot, changed by none.

use std::time::Duration;

/// How a worker runs generation shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenSettings {
    /// Sequences generated at once.
    pub max_seqs: usize,
    /// Bytes the sequences' key/value caches may take together.
    pub kv_budget_bytes: usize,
    /// How often finished records are checkpointed to the store.
    pub checkpoint_every: Duration,
    /// Shards one running batch may hold at once (1: each shard runs
    /// alone); the worker pulls extra shards of the running model while
    /// the batch has free sequences.
    pub max_shards: usize,
}

impl Default for GenSettings {
    fn default() -> Self {
        Self {
            max_seqs: 32,
            kv_budget_bytes: 512 << 20,
            checkpoint_every: Duration::from_secs(10),
            max_shards: 4,
        }
    }
}

/// A worker's settings for running shards. Plain values: shared behind
/// the worker's context, they cannot change once it runs.
pub(crate) struct Settings {
    /// Shards run at once.
    pub(crate) slots: usize,
    /// Texts per forward pass when the job does not set one.
    pub(crate) max_batch: usize,
    /// Tokens per forward pass.
    pub(crate) batch_tokens: usize,
    /// How generation shards run.
    pub(crate) generation: GenSettings,
    /// The work stream's ack wait (progress is sent well within it).
    pub(crate) ack_wait: Duration,
    /// The work stream's deliveries per shard (the last one fails for good).
    pub(crate) max_deliver: i64,
    /// How often the cancellation markers of running jobs are read.
    pub(crate) cancel_check: Duration,
    /// The most memory models may use here, MB (0 = no cap).
    pub(crate) mem_budget_mb: u64,
    /// Quiet mode: the largest share of time the device may work, (0, 1].
    pub(crate) duty_cycle: f64,
    /// The test-only fault switch ([`crate::fault`]); `None` in real use.
    pub(crate) perturb: Option<crate::fault::Perturb>,
    /// The test-only pace switch ([`crate::pace`]); `None` in real use.
    pub(crate) pace: Option<crate::pace::Pace>,
}
