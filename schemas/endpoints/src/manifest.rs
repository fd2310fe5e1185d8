//! Job manifests in the store. A manifest is never overwritten: the first
//! is written create-only at `jobs/JOB/manifest.msgpack`; when a later
//! event changes what it records (a retry completes failed shards, a
//! verdict replaces a result, a quarantine withdraws one), the new record is
//! written create-only as the next revision, `jobs/JOB/manifest.N.msgpack`.
//! Readers take the newest revision. A revision never has fewer shards
//! done than the one before, and one equal to the newest (its completion
//! time aside) is not written again.

use minions_schemas::messages::JobManifest;
use minions_schemas::{CodecError, JobId, decode, encode, keys, limits};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};

/// Revisions looked for, at most (a job changes a handful of times).
pub const MAX_REVISIONS: u32 = 10_000;

/// Why a manifest could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The store failed.
    #[error("the store: {0}")]
    Store(#[from] object_store::Error),
    /// A revision is larger than any manifest may be.
    #[error("revision {revision} of the manifest is {size} bytes, over the limit of {limit}")]
    TooLarge {
        /// Which revision.
        revision: u32,
        /// Its size.
        size: u64,
        /// The limit.
        limit: usize,
    },
    /// A revision does not decode, or the record does not encode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// Other writers kept adding revisions while this one tried.
    #[error("revision {0} was taken by another writer each time")]
    Contended(u32),
}

/// What [`write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Wrote this revision.
    New(u32),
    /// The newest revision (this one) records the same: nothing written.
    Same(u32),
    /// The newest revision (this one) has more shards done: nothing written.
    Kept(u32),
}

async fn read_revision(
    store: &dyn ObjectStore,
    job: &JobId,
    n: u32,
) -> Result<Option<JobManifest>, ManifestError> {
    let key = StorePath::from(keys::job_manifest_revision(job, n));
    let got = match store.get(&key).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let limit = limits::MAX_JOB_MANIFEST_BYTES;
    if got.meta.size > limit as u64 {
        return Err(ManifestError::TooLarge {
            revision: n,
            size: got.meta.size,
            limit,
        });
    }
    let bytes = got.bytes().await?;
    Ok(Some(decode("job manifest", &bytes, limit)?))
}

/// The newest revision of `job`'s manifest and its number; None when none
/// is written.
pub async fn latest(
    store: &dyn ObjectStore,
    job: &JobId,
) -> Result<Option<(u32, JobManifest)>, ManifestError> {
    let Some(mut newest) = read_revision(store, job, 1).await? else {
        return Ok(None);
    };
    let mut n = 1;
    while n < MAX_REVISIONS {
        match read_revision(store, job, n + 1).await? {
            Some(m) => {
                newest = m;
                n += 1;
            }
            None => break,
        }
    }
    Ok(Some((n, newest)))
}

/// Writes `m` as the next revision of its job's manifest, unless the
/// newest one records the same or has more shards done.
pub async fn write(store: &dyn ObjectStore, m: &JobManifest) -> Result<Written, ManifestError> {
    let bytes = encode("job manifest", m)?;
    let mut tried = 0;
    loop {
        let next = match latest(store, &m.job).await? {
            None => 1,
            Some((n, old)) => {
                if old.done > m.done {
                    return Ok(Written::Kept(n));
                }
                if (JobManifest {
                    completed_ms: m.completed_ms,
                    ..old
                }) == *m
                {
                    return Ok(Written::Same(n));
                }
                n + 1
            }
        };
        let key = StorePath::from(keys::job_manifest_revision(&m.job, next));
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match store.put_opts(&key, bytes.clone().into(), opts).await {
            Ok(_) => return Ok(Written::New(next)),
            // Another writer took this revision: look again.
            Err(object_store::Error::AlreadyExists { .. }) if tried < 5 => tried += 1,
            Err(object_store::Error::AlreadyExists { .. }) => {
                return Err(ManifestError::Contended(next));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::SCHEMA_VERSION;

    fn manifest(
        done: u32,
        failed: u32,
        at: u64,
    ) -> Result<JobManifest, Box<dyn std::error::Error>> {
        Ok(JobManifest {
            v: SCHEMA_VERSION,
            job: JobId::new("j")?,
            model_hash: minions_schemas::ModelHash::new("a".repeat(64))?,
            records: 10,
            done,
            failed,
            rejected: 0,
            verified: 0,
            disagreements: 0,
            unverified: 0,
            shards: Vec::new(),
            completed_ms: at,
        })
    }

    #[tokio::test]
    async fn revisions_are_added_never_overwritten() -> Result<(), Box<dyn std::error::Error>> {
        let store = object_store::memory::InMemory::new();
        let job = JobId::new("j")?;
        assert!(latest(&store, &job).await?.is_none());
        let first = manifest(8, 2, 1)?;
        assert_eq!(write(&store, &first).await?, Written::New(1));
        // The same record later: nothing written.
        assert_eq!(write(&store, &manifest(8, 2, 5)?).await?, Written::Same(1));
        // A retry completed the failed shards: a second revision beside the first.
        let second = manifest(10, 0, 9)?;
        assert_eq!(write(&store, &second).await?, Written::New(2));
        assert_eq!(read_revision(&store, &job, 1).await?, Some(first));
        assert_eq!(latest(&store, &job).await?, Some((2, second.clone())));
        // Fewer shards done than the newest: kept as it is.
        assert_eq!(write(&store, &manifest(9, 1, 12)?).await?, Written::Kept(2));
        assert_eq!(latest(&store, &job).await?, Some((2, second)));
        Ok(())
    }
}
