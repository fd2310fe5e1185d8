use serde::{Deserialize, Serialize};

use crate::ids::{JobId, ModelHash, WorkerId};
use crate::messages::{
    AudioRecord, Generation, GenerationRecord, PartialTranscription, Transcription,
};

/// One shard's input records, stored at [`crate::keys::shard_input`].
/// Limit: [`crate::limits::MAX_SHARD_INPUT_BYTES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// The records' texts, in input order (embedding jobs).
    pub texts: Vec<String>,
    /// The records, in input order (generation jobs; `texts` is empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<GenerationRecord>,
    /// The audio files, in input order (speech jobs; `texts` is empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audio: Vec<AudioRecord>,
}

impl ShardInput {
    /// Records in this shard, whichever kind it holds.
    pub fn len(&self) -> usize {
        self.texts
            .len()
            .max(self.records.len())
            .max(self.audio.len())
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
    /// One generation per record, in input order.
    Generations {
        /// The results.
        records: Vec<Generation>,
    },
    /// One transcript per audio file, in input order.
    Transcripts {
        /// The results.
        records: Vec<Transcription>,
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
    /// The build, device and kernel path that made it (absent in older
    /// outputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made_by: Option<super::Provenance>,
}

impl ShardOutput {
    /// Checks that this is an output of `shard` of `job` holding `rows`
    /// records, with a payload of that size; says why not.
    pub fn check_belongs(&self, job: &JobId, shard: u32, rows: u64) -> Result<(), String> {
        if self.job != *job || self.shard != shard {
            return Err(format!(
                "the object holds job {} shard {}, not job {job} shard {shard}",
                self.job, self.shard
            ));
        }
        if self.rows != rows {
            return Err(format!("the output holds {} rows, not {rows}", self.rows));
        }
        self.check_shape().map(|_| ())
    }

    /// Checks that the payload's size matches `rows` (a defence against a
    /// truncated or forged output); returns the vector length (0 for
    /// generations).
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
            OutputPayload::Generations { records } => {
                if records.len() as u64 != self.rows {
                    return Err(format!(
                        "output of shard {} holds {} generations for {} rows",
                        self.shard,
                        records.len(),
                        self.rows
                    ));
                }
                Ok(0)
            }
            OutputPayload::Transcripts { records } => {
                if records.len() as u64 != self.rows {
                    return Err(format!(
                        "output of shard {} holds {} transcripts for {} rows",
                        self.shard,
                        records.len(),
                        self.rows
                    ));
                }
                Ok(0)
            }
        }
    }
}

/// Records a delivery of a long shard has finished so far, stored at
/// [`crate::keys::shard_checkpoint`] (overwritten as the shard goes on).
/// A redelivery keeps these and runs only the rest; each record's result
/// depends on the record alone, so the output is the same either way.
/// Limit: [`crate::limits::MAX_SHARD_OUTPUT_BYTES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardCheckpoint {
    /// Schema version.
    pub v: u16,
    /// The job.
    pub job: JobId,
    /// The shard.
    pub shard: u32,
    /// Records in the shard.
    pub rows: u64,
    /// The model that made the results (a checkpoint of another is ignored).
    pub model_hash: ModelHash,
    /// Finished records: index within the shard, and result.
    pub done: Vec<(u32, Generation)>,
    /// Finished audio files (speech jobs): index within the shard, and
    /// transcript.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transcripts: Vec<(u32, Transcription)>,
    /// Long audio files part-way (speech jobs): index, and the windows done.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partial: Vec<(u32, PartialTranscription)>,
}
