use serde::{Deserialize, Serialize};

use crate::ids::JobId;

/// A shard that will not be delivered again: the record the watchdog writes
/// into the dead-letter stream when JetStream gives up on a message (max
/// deliveries) or a worker terminates it. Limit:
/// [`crate::limits::MAX_EVENT_BYTES`] plus the task it carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Schema version.
    pub v: u16,
    /// The job.
    pub job: JobId,
    /// The shard.
    pub shard: u32,
    /// The original task message, as published.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// Why it died: the last error a worker reported, or the advisory's reason.
    pub reason: String,
    /// `max_deliveries` or `terminated`.
    pub cause: String,
    /// Deliveries it had.
    pub deliveries: u64,
    /// Hosts that tried it, oldest first.
    pub hosts: Vec<String>,
    /// Work-stream sequence of the message.
    pub stream_seq: u64,
    /// When the record was written (ms since the epoch).
    pub at_ms: u64,
}
