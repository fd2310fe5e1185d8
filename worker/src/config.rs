//! The worker's configuration, from flags and environment (the flags are in `cli`).

use std::path::PathBuf;
use std::time::Duration;

use minions_schemas::streams::WorkSettings;

use crate::model::{DeviceChoice, EnginePath};

/// Everything a worker needs to run. Built from the flags (`cli::WorkerArgs`) or by a program that embeds a worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// NATS server URL.
    pub nats_url: String,
    /// NATS credentials and TLS.
    pub nats_security: minions_endpoints::nats::NatsSecurity,
    /// Object store URL (`file://…` or `s3://…`).
    pub store_url: String,
    /// Local folder for model files.
    pub cache_dir: PathBuf,
    /// Shards held at once. One runs on the device at a time; the others
    /// fetch inputs and write outputs meanwhile. Each slot is one unacked
    /// delivery: keep slots × workers under the consumer's max-ack-pending.
    pub slots: usize,
    /// Which device to run on.
    pub device: DeviceChoice,
    /// Our CPU kernels, or the code a GPU runs, on the CPU.
    pub engine_path: EnginePath,
    /// Texts per forward pass when the job does not say.
    pub max_batch: usize,
    /// Tokens per forward pass, padding included (a longer text runs
    /// alone).
    pub batch_tokens: usize,
    /// How often the worker publishes a heartbeat.
    pub heartbeat_interval: Duration,
    /// How often the worker reads the cancellation markers of the jobs it
    /// runs (a cancellation it did not hear still stops them).
    pub cancel_check: Duration,
    /// On shutdown, how long running shards may take to finish before they
    /// are handed back.
    pub drain_timeout: Duration,
    /// How long an idle slot waits for a new schedule before it looks at
    /// the last one again.
    pub pull_expires: Duration,
    /// Memory lent to models, MB (`None`: the policy's cap, else the GPU's
    /// or the machine's memory).
    pub lend_memory_mb: Option<u64>,
    /// Models kept loaded at once.
    pub keep_warm: usize,
    /// Prefix of the worker id (default: the host name).
    pub name: Option<String>,
    /// Job consumer settings used if this worker is the one that creates the
    /// work stream (an existing stream keeps its settings).
    pub work: WorkSettings,
    /// The owner-first policy; `None` lends the machine whenever it runs.
    pub policy: Option<crate::owner::Policy>,
    /// How generation shards run: sequences at once, KV-cache memory,
    /// checkpoint interval.
    pub generation: crate::generation::GenSettings,
    /// Watts the energy estimate uses while shards run, when no meter can
    /// be read (`None`: a figure for the device kind; see
    /// [`crate::energy::estimate`]). Finite and ≥ 0.
    pub power_watts: Option<f64>,
}

impl WorkerConfig {
    /// A configuration with the documented defaults for `nats_url` and `store_url`.
    pub fn new(nats_url: impl Into<String>, store_url: impl Into<String>) -> Self {
        Self {
            nats_url: nats_url.into(),
            nats_security: Default::default(),
            store_url: store_url.into(),
            cache_dir: default_cache_dir(),
            slots: 2,
            device: DeviceChoice::Auto,
            engine_path: EnginePath::Fast,
            max_batch: crate::model::Batching::DEFAULT_TEXTS,
            batch_tokens: crate::model::Batching::DEFAULT_TOKENS,
            heartbeat_interval: Duration::from_secs(1),
            cancel_check: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
            pull_expires: Duration::from_secs(1),
            lend_memory_mb: None,
            keep_warm: 2,
            name: None,
            work: WorkSettings::default(),
            policy: None,
            generation: Default::default(),
            power_watts: None,
        }
    }
}

/// `<cache dir>/minions/models` (e.g. `~/.cache/minions/models`).
pub fn default_cache_dir() -> PathBuf {
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("minions")
        .join("models")
}
