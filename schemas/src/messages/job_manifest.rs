use serde::{Deserialize, Serialize};

use crate::ids::{JobId, ModelHash, WorkerId};

/// One shard's line in a job manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestShard {
    /// The shard.
    pub shard: u32,
    /// `done` or `failed`.
    pub outcome: String,
    /// The output key (done shards).
    pub output_key: Option<String>,
    /// SHA-256 of the output object, hex (done shards).
    pub sha256: Option<String>,
    /// The worker that finished it.
    pub worker: Option<WorkerId>,
    /// The build, device and kernel path that made its output (done shards
    /// whose done event said; absent in older manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made_by: Option<super::Provenance>,
    /// Deliveries it took.
    pub attempts: u64,
    /// Wall time of the successful run, ms.
    pub duration_ms: u64,
    /// Why it failed (failed shards).
    pub reason: Option<String>,
}

/// The record of a finished job, written create-only to
/// [`crate::keys::job_manifest`] when every shard is done or failed; a later
/// change is written, create-only too, as the next revision
/// ([`crate::keys::job_manifest_revision`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobManifest {
    /// Schema version.
    pub v: u16,
    /// The job.
    pub job: JobId,
    /// The model that ran.
    pub model_hash: ModelHash,
    /// Records in the job.
    pub records: u64,
    /// Shards done.
    pub done: u32,
    /// Shards failed.
    pub failed: u32,
    /// Results a watchdog rejected on the way (`done` events not backed by
    /// their output: forged or corrupt); each of those shards ran again.
    #[serde(default)]
    pub rejected: u32,
    /// Shards whose result a check run on another machine confirmed (or
    /// the majority of three decided).
    #[serde(default)]
    pub verified: u32,
    /// Check runs that disagreed with the result they checked.
    #[serde(default)]
    pub disagreements: u32,
    /// Shards picked for a check whose check closed without one (no other
    /// machine ran it within the watchdog's `--checks-wait-secs`, or all
    /// disagreed): their result stands unverified.
    #[serde(default)]
    pub unverified: u32,
    /// Every shard, in order.
    pub shards: Vec<ManifestShard>,
    /// When the manifest was written (ms since the epoch).
    pub completed_ms: u64,
}
