use serde::{Deserialize, Serialize};

use crate::ids::{JobId, ModelHash, ModelName};
use crate::messages::{ModelFamily, Precision, Priority, Requirements};

/// Where a job's records came from, for people and for refusing a re-submit
/// of the same job id with different input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputDescription {
    /// The input file as the user named it.
    pub source: String,
    /// SHA-256 of the input bytes, hex.
    pub sha256: String,
    /// Input size in bytes.
    pub bytes: u64,
    /// JSON field holding each record's text.
    pub text_field: String,
    /// JSON field holding each record's id, if any.
    pub id_field: Option<String>,
}

/// A job: what to run over which records, cut into how many shards.
///
/// Stored at [`crate::keys::job_spec`] before any shard is published; never
/// changed afterwards. Limit: [`crate::limits::MAX_SPEC_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Schema version.
    pub v: u16,
    /// The job id.
    pub job: JobId,
    /// The model name the user asked for.
    pub model_name: ModelName,
    /// The exact model content the job runs (names can move; jobs cannot).
    pub model_hash: ModelHash,
    /// The model family (decides the output shape).
    pub family: ModelFamily,
    /// The input file.
    pub input: InputDescription,
    /// Records per shard (the last shard may have fewer).
    pub shard_size: u32,
    /// Texts per forward pass (0 = each worker's default).
    pub max_batch: u32,
    /// The number format every shard runs in (absent in older specs: f32).
    #[serde(default)]
    pub precision: Precision,
    /// Number of shards, numbered `0..shards`.
    pub shards: u32,
    /// Number of records accepted, in input order across shards.
    pub records: u64,
    /// Malformed lines skipped with `--skip-bad`.
    pub skipped: u64,
    /// When the job was submitted (ms since the epoch).
    pub created_ms: u64,
    /// The team that submitted it (fair share is kept between teams;
    /// absent in older specs: [`DEFAULT_TEAM`]).
    #[serde(default = "default_team")]
    pub team: String,
    /// Its priority within the team (absent in older specs: normal).
    #[serde(default)]
    pub priority: Priority,
    /// Whether its running shards yield their slots to other work (handed
    /// back, never lost).
    #[serde(default)]
    pub preemptible: bool,
    /// What a worker must lend to run it (absent in older specs: nothing).
    #[serde(default)]
    pub needs: Requirements,
    /// Who submitted it: the NATS identity when one was given, else the
    /// submitting OS user at the host (absent in older specs: empty).
    #[serde(default)]
    pub submitter: String,
    /// Share of its shards run a second time on another machine to check
    /// the result, parts per million (None: the fleet's default; absent in
    /// older specs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_ppm: Option<u32>,
    /// A language model's layers, for a job split over a group
    /// ([`super::Requirements::stages`]); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// Each stage's share of the layers, first stage first, as the
    /// submitter asked (`submit --split`; as many as `needs.stages`, none
    /// zero); empty: the watchdog shares layers by the memory each member
    /// lends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stage_split: Vec<u32>,
}

/// The team of a job submitted without one.
pub const DEFAULT_TEAM: &str = "default";

fn default_team() -> String {
    DEFAULT_TEAM.to_owned()
}

impl JobSpec {
    /// The task message of `shard`: everything in it follows from the spec,
    /// so a lost or dead-lettered task can be rebuilt exactly.
    pub fn task(&self, shard: u32) -> crate::messages::ShardTask {
        crate::messages::ShardTask {
            v: crate::SCHEMA_VERSION,
            job: self.job.clone(),
            shard,
            shards: self.shards,
            rows: u32::try_from(self.shard_rows(shard)).unwrap_or(u32::MAX),
            first_row: u64::from(shard) * u64::from(self.shard_size),
            model_hash: self.model_hash.clone(),
            family: self.family,
            max_batch: self.max_batch,
            precision: self.precision,
            check: 0,
            avoid: Vec::new(),
        }
    }

    /// The number of records in `shard` (all but the last are full).
    pub fn shard_rows(&self, shard: u32) -> u64 {
        let start = u64::from(shard) * u64::from(self.shard_size);
        self.records
            .saturating_sub(start)
            .min(u64::from(self.shard_size))
    }
}

/// A small spec for tests: job `j`, 4 shards of 10 records, 35 in all.
#[cfg(test)]
pub(crate) fn test_spec() -> Result<JobSpec, crate::IdError> {
    test_spec_of("j", 4, 35)
}

/// A spec for tests: an f32 embedding job `job` of model `m`, `shards`
/// shards of 10 records, `records` in all. Compiled always, not behind a
/// feature: a feature turned on by other crates' dev-dependencies would
/// change the contract crate between CI's build and test steps and
/// rebuild everything above it (over 2 minutes).
#[doc(hidden)]
pub fn test_spec_of(job: &str, shards: u32, records: u64) -> Result<JobSpec, crate::IdError> {
    Ok(JobSpec {
        submitter: String::new(),
        verify_ppm: None,
        layers: None,
        stage_split: Vec::new(),
        v: crate::SCHEMA_VERSION,
        job: crate::JobId::new(job)?,
        model_name: crate::ModelName::new("m")?,
        model_hash: crate::ModelHash::new("a".repeat(64))?,
        family: crate::messages::ModelFamily::BertEmbedding,
        input: crate::messages::InputDescription {
            source: "x".into(),
            sha256: String::new(),
            bytes: 0,
            text_field: "text".into(),
            id_field: None,
        },
        shard_size: 10,
        max_batch: 0,
        precision: crate::messages::Precision::F32,
        shards,
        records,
        skipped: 0,
        created_ms: 0,
        team: crate::messages::DEFAULT_TEAM.to_owned(),
        priority: Default::default(),
        preemptible: false,
        needs: Default::default(),
    })
}
