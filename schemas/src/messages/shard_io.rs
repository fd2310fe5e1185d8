use serde::{Deserialize, Serialize};

use crate::ids::{JobId, ModelHash, WorkerId};

/// One shard's input records, stored at [`crate::keys::shard_input`].
/// Limit: [`crate::limits::MAX_SHARD_INPUT_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInput {
    /// Schema version.
    pub v: u16,
    /// The job.
    pub job: JobId,
    /// The shard.
    pub shard: u32,
    /// Index of the first record in the job's input order.
    pub first_row: u64,
    /// The records' ids from the input, when the job names an id field.
    pub ids: Option<Vec<String>>,
    /// The records' texts, in input order.
    pub texts: Vec<String>,
}

/// A shard's result, by model family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputPayload {
    /// Row-major little-endian f32 vectors, `rows × dim`.
    Embeddings {
        /// Vector length.
        dim: u32,
        /// `rows × dim × 4` bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
}

/// One shard's output, stored create-only at [`crate::keys::shard_output`].
/// Limit: [`crate::limits::MAX_SHARD_OUTPUT_BYTES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardOutput {
    /// Schema version.
    pub v: u16,
    /// The job.
    pub job: JobId,
    /// The shard.
    pub shard: u32,
    /// Index of the first record in the job's input order.
    pub first_row: u64,
    /// Records in this output, one row each.
    pub rows: u64,
    /// The model that made it.
    pub model_hash: ModelHash,
    /// The worker that made it.
    pub worker: WorkerId,
    /// The result.
    pub payload: OutputPayload,
}

impl ShardOutput {
    /// Checks that the payload's size matches `rows` (a defence against a
    /// truncated or forged output); returns the vector length.
    pub fn check_shape(&self) -> Result<u32, String> {
        match &self.payload {
            OutputPayload::Embeddings { dim, data } => {
                let want = self
                    .rows
                    .checked_mul(u64::from(*dim))
                    .and_then(|n| n.checked_mul(4));
                if want != Some(data.len() as u64) {
                    return Err(format!(
                        "output of shard {} holds {} bytes, but {} rows of dimension {} need {:?}",
                        self.shard,
                        data.len(),
                        self.rows,
                        dim,
                        want
                    ));
                }
                Ok(*dim)
            }
        }
    }
}
