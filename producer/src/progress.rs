//! A job's progress: its spec and its events, read from the store and the
//! events stream, folded by [`minions_schemas::progress`].

use anyhow::Context;
use async_nats::jetstream;
use minions_endpoints::snapshot;
use minions_schemas::messages::ShardEvent;
use minions_schemas::{JobId, decode, keys, limits, streams, subjects};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::store_io::job_spec;

pub use minions_schemas::progress::{FailedShard, JobState, Progress, fold, human_secs};

/// Loads the job's spec (an unknown job is an error) and folds its events.
pub async fn load(
    js: &jetstream::Context,
    store: &dyn ObjectStore,
    job: &JobId,
) -> anyhow::Result<Progress> {
    let spec = job_spec(store, job).await?;
    let events = read_events(js, job).await?;
    let mut p = fold(&spec, &events, minions_schemas::time::now_ms());
    // A job that asked for checks is complete when a watchdog says so (its
    // manifest, written once every check it queued is judged): the events
    // alone cannot tell a done shard whose check is still to be queued
    // from one that was not picked.
    if matches!(p.state, JobState::Done | JobState::Failed)
        && spec.verify_ppm.is_some_and(|ppm| ppm > 0)
    {
        let manifest = StorePath::from(keys::job_manifest(job));
        match store.head(&manifest).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => p.state = JobState::Running,
            Err(e) => return Err(e).context("reading the job's manifest"),
        }
    }
    let marker = StorePath::from(keys::job_cancelled(job));
    if p.state != JobState::Done && store.head(&marker).await.is_ok() {
        p.state = JobState::Cancelled;
    }
    Ok(p)
}

async fn read_events(js: &jetstream::Context, job: &JobId) -> anyhow::Result<Vec<ShardEvent>> {
    let messages = snapshot::read(
        js,
        streams::EVENTS_STREAM,
        &subjects::job_events(job),
        false,
    )
    .await
    .context("reading the job's events")?;
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        match decode::<ShardEvent>("shard event", &m.payload, limits::MAX_EVENT_BYTES) {
            Ok(e) if &e.job == job && e.is_on(&m.subject) => out.push(e),
            Ok(e) => {
                tracing::warn!(subject = %m.subject, worker = %e.worker, "ignoring an event on a subject its sender does not use")
            }
            Err(e) => {
                tracing::warn!(subject = %m.subject, error = %e, "ignoring an event that does not decode")
            }
        }
    }
    Ok(out)
}
