use serde::{Deserialize, Serialize};

use crate::ids::{JobId, ModelHash};
use crate::messages::{ModelFamily, Precision};

/// One shard to run: the payload of a work-stream message.
///
/// It carries ids only; the worker builds the input and output keys from them
/// ([`crate::keys`]), never from strings in the message. Limit:
/// [`crate::limits::MAX_TASK_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardTask {
    /// Schema version.
    pub v: u16,
    /// The job.
    pub job: JobId,
    /// The shard number, `0..shards`.
    pub shard: u32,
    /// The job's shard count.
    pub shards: u32,
    /// Records in this shard.
    pub rows: u32,
    /// Index of this shard's first record in the job's input order.
    pub first_row: u64,
    /// The model to run.
    pub model_hash: ModelHash,
    /// The model's family.
    pub family: ModelFamily,
    /// Most records per forward pass (0 = the worker's default).
    pub max_batch: u32,
    /// The number format the model runs in (absent in older tasks: f32).
    #[serde(default)]
    pub precision: Precision,
}
