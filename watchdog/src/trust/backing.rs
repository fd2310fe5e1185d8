//! Whether a `done` event is backed by its output: the output object must
//! exist, hash to the event's SHA-256, and be an output of that shard of
//! that job with the rows the event reports. A `done` that is not backed
//! is forged (no output: the worker never wrote one) or corrupt (an output
//! that is not what the event says).

use minions_schemas::messages::ShardOutput;
use minions_schemas::{JobId, decode, keys, limits};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};

/// What the store says about a `done` event's output.
#[derive(Debug, Clone, PartialEq)]
pub enum Backing {
    /// The output is there and is what the event says; it is returned so
    /// that a check can compare it without reading it again.
    Backed(Box<ShardOutput>),
    /// No output object: the event is forged.
    Missing,
    /// An output is there but is not what the event says (another
    /// delivery's, or damaged): the reason.
    Mismatch(String),
}

/// Why the store could not say (the check is retried; nothing is decided).
#[derive(Debug, thiserror::Error)]
#[error("output of job {job} shard {shard} could not be read: {source}")]
pub struct BackingError {
    job: JobId,
    shard: u32,
    #[source]
    source: object_store::Error,
}

/// Reads the output of `shard` of `job` and checks it against a `done`
/// event's `sha256` and `rows`.
pub async fn check(
    store: &dyn ObjectStore,
    job: &JobId,
    shard: u32,
    sha256: &str,
    rows: u64,
) -> Result<Backing, BackingError> {
    check_at(
        store,
        keys::shard_output(job, shard),
        job,
        shard,
        sha256,
        rows,
    )
    .await
}

/// [`check`] of the output at `key` (a check run's, [`keys::shard_check`]).
pub async fn check_at(
    store: &dyn ObjectStore,
    key: String,
    job: &JobId,
    shard: u32,
    sha256: &str,
    rows: u64,
) -> Result<Backing, BackingError> {
    let key = StorePath::from(key);
    let err = |source| BackingError {
        job: job.clone(),
        shard,
        source,
    };
    let got = match store.get(&key).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => return Ok(Backing::Missing),
        Err(e) => return Err(err(e)),
    };
    if got.meta.size > limits::MAX_SHARD_OUTPUT_BYTES as u64 {
        return Ok(Backing::Mismatch(format!(
            "the output is {} bytes, over the limit of {}",
            got.meta.size,
            limits::MAX_SHARD_OUTPUT_BYTES
        )));
    }
    let bytes = got.bytes().await.map_err(err)?;
    let found = hex::encode(Sha256::digest(&bytes));
    if !found.eq_ignore_ascii_case(sha256) {
        return Ok(Backing::Mismatch(format!(
            "the output's SHA-256 is {found}, the event says {sha256}"
        )));
    }
    let out: ShardOutput = match decode("shard output", &bytes, limits::MAX_SHARD_OUTPUT_BYTES) {
        Ok(o) => o,
        Err(e) => {
            return Ok(Backing::Mismatch(format!(
                "the output does not decode: {e}"
            )));
        }
    };
    match out.check_belongs(job, shard, rows) {
        Ok(()) => Ok(Backing::Backed(Box::new(out))),
        Err(why) => Ok(Backing::Mismatch(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::messages::OutputPayload;
    use minions_schemas::{ModelHash, SCHEMA_VERSION, WorkerId, encode};
    use object_store::memory::InMemory;

    type Res = Result<(), Box<dyn std::error::Error>>;

    async fn put(
        store: &InMemory,
        job: &JobId,
        shard: u32,
    ) -> Result<String, Box<dyn std::error::Error>> {
        let out = ShardOutput {
            v: SCHEMA_VERSION,
            job: job.clone(),
            shard,
            first_row: 0,
            rows: 1,
            model_hash: ModelHash::new("ab".repeat(32))?,
            worker: WorkerId::new("w1")?,
            payload: OutputPayload::Embeddings {
                dim: 2,
                data: [0.6f32, 0.8].iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
            made_by: None,
        };
        let bytes = encode("shard output", &out)?;
        let sha = hex::encode(Sha256::digest(&bytes));
        store
            .put(
                &StorePath::from(keys::shard_output(job, shard)),
                bytes.into(),
            )
            .await?;
        Ok(sha)
    }

    #[tokio::test]
    async fn a_done_is_backed_only_by_its_own_output() -> Res {
        let store = InMemory::new();
        let job = JobId::new("j")?;
        let sha = put(&store, &job, 1).await?;
        assert!(matches!(
            check(&store, &job, 1, &sha, 1).await?,
            Backing::Backed(o) if o.shard == 1
        ));
        assert_eq!(check(&store, &job, 2, &sha, 1).await?, Backing::Missing);
        assert!(matches!(
            check(&store, &job, 1, &"00".repeat(32), 1).await?,
            Backing::Mismatch(why) if why.contains("SHA-256")
        ));
        assert!(matches!(
            check(&store, &job, 1, &sha, 5).await?,
            Backing::Mismatch(why) if why.contains("rows")
        ));
        // Another shard's output copied under this shard's key.
        let other = put(&store, &job, 3).await?;
        let bytes = store
            .get(&StorePath::from(keys::shard_output(&job, 3)))
            .await?
            .bytes()
            .await?;
        store
            .put(&StorePath::from(keys::shard_output(&job, 4)), bytes.into())
            .await?;
        assert!(matches!(
            check(&store, &job, 4, &other, 1).await?,
            Backing::Mismatch(why) if why.contains("shard 3")
        ));
        Ok(())
    }
}
