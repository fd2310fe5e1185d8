use serde::{Deserialize, Serialize};

use crate::ids::{JobId, WorkerId};

/// What happened to a shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// The job was submitted (or submitted again); a job-level event, sent
    /// with shard 0, so that watchers learn of a job before any shard runs.
    Submitted {
        /// Shards in the job.
        shards: u32,
    },
    /// A worker started running the shard.
    Started,
    /// The shard's output is in the store.
    Done {
        /// Records in the output.
        rows: u64,
        /// Bytes written (0 when an earlier delivery had written it).
        output_bytes: u64,
        /// Wall time of the run, ms.
        duration_ms: u64,
        /// Pure inference time, ms.
        compute_ms: u64,
        /// True when the output already existed (an earlier delivery finished it).
        already_done: bool,
        /// SHA-256 of the output object, hex.
        sha256: String,
    },
    /// The shard was queued again by `minions retry` after it had failed.
    Requeued,
    /// The worker gave the shard back unfinished (its owner returned, it was
    /// evicted or it stopped); another worker takes it at once.
    HandedBack {
        /// Why, e.g. `owner: input 0 s ago`.
        reason: String,
    },
    /// The shard failed on this delivery.
    Failed {
        /// Why, in words a person can act on.
        reason: String,
        /// True when it will never be retried (bad input, unknown model).
        permanent: bool,
    },
}

/// An event about one shard, published on [`crate::subjects::event`] into the
/// events stream. Limit: [`crate::limits::MAX_EVENT_BYTES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardEvent {
    /// Schema version.
    pub v: u16,
    /// The job.
    pub job: JobId,
    /// The shard.
    pub shard: u32,
    /// The worker that sends it.
    pub worker: WorkerId,
    /// The worker's host name.
    pub host: String,
    /// Which delivery of the shard this is (1 = first).
    pub attempt: u64,
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl ShardEvent {
    /// Whether `subject` is the one this event's sender publishes it on. An
    /// event on another subject claims a sender whose identity did not send
    /// it (or comes from an older release); readers ignore it.
    pub fn is_on(&self, subject: &str) -> bool {
        crate::subjects::is_event_of(subject, &self.job, self.shard, &self.worker)
    }
}
