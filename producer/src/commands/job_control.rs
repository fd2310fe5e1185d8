//! `minions retry`, `minions cancel` and `minions reconcile`: acting on a
//! job's shards after submit.

use anyhow::Context;
use async_nats::jetstream;
use minions_schemas::messages::{ActionKind, EventKind, JobSpec};
use minions_schemas::{JobId, keys, streams, subjects};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};

use crate::cli::Endpoints;
use crate::progress;
use crate::publish;
use crate::store_io::job_spec;

struct Ctx {
    js: jetstream::Context,
    client: async_nats::Client,
    store: std::sync::Arc<dyn ObjectStore>,
    job: JobId,
    spec: JobSpec,
}

async fn open(endpoints: &Endpoints, job: &str, who: &str) -> anyhow::Result<Ctx> {
    let job = JobId::new(job).context("job id")?;
    let store = minions_endpoints::store::open(&endpoints.store_url())?;
    let spec = job_spec(store.as_ref(), &job).await?;
    let (client, js) = endpoints.connect(who).await?;
    let settings =
        minions_endpoints::streams::ensure(&js, &endpoints.replication.work_settings()).await?;
    // Retry and reconcile queue shards again: the job's consumer (removed
    // once a job has nothing queued) must exist first.
    minions_endpoints::queue::ensure_job_consumer(&js, &settings, &spec).await?;
    Ok(Ctx {
        js,
        client,
        store,
        job,
        spec,
    })
}

/// Resubmits a job's failed shards (after their cause is fixed). Returns a summary line.
pub async fn retry(endpoints: &Endpoints, job: &str) -> anyhow::Result<String> {
    let c = open(endpoints, job, "minions retry").await?;
    let p = progress::load(&c.js, c.store.as_ref(), &c.job).await?;
    if p.failed_shards.is_empty() {
        return Ok(format!("job {}: no failed shards to retry", c.job));
    }
    super::audit::record(
        endpoints,
        &c.js,
        ActionKind::Retry,
        c.job.as_str(),
        &format!("{} failed shards", p.failed_shards.len()),
    )
    .await?;
    let nonce = ulid::Ulid::new().to_string().to_lowercase();
    let mut n = 0;
    for f in &p.failed_shards {
        publish::event(&c.js, &c.job, f.shard, EventKind::Requeued).await?;
        let msg_id = format!("{}/retry-{nonce}", subjects::msg_id(&c.job, f.shard));
        if publish::task(&c.js, &c.spec.task(f.shard), &msg_id).await? {
            n += 1;
        }
    }
    tracing::info!(job = %c.job, shards = n, "failed shards resubmitted");
    Ok(format!("job {}: {n} failed shards resubmitted", c.job))
}

/// Cancels a job: marks it cancelled, removes its pending shards, and tells
/// workers to stop the running ones.
pub async fn cancel(endpoints: &Endpoints, job: &str) -> anyhow::Result<String> {
    let c = open(endpoints, job, "minions cancel").await?;
    super::audit::record(endpoints, &c.js, ActionKind::Cancel, c.job.as_str(), "").await?;
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match c
        .store
        .put_opts(
            &StorePath::from(keys::job_cancelled(&c.job)),
            bytes::Bytes::new().into(),
            opts,
        )
        .await
    {
        Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
        Err(e) => return Err(e).context("writing the cancellation marker"),
    }
    let work = c.js.get_stream(streams::WORK_STREAM).await?;
    let purged = work
        .purge()
        .filter(subjects::job_work(&c.job))
        .await
        .context("removing pending shards")?
        .purged;
    c.client
        .publish(subjects::cancel(&c.job), bytes::Bytes::new())
        .await
        .context("telling workers")?;
    c.client.flush().await?;
    tracing::info!(job = %c.job, purged, "job cancelled");
    Ok(format!(
        "job {}: cancelled; {purged} pending shards removed, running shards stopped",
        c.job
    ))
}

/// Republishes every shard that is neither done, queued nor failed, under
/// its original message id (so two reconcilers cannot queue it twice).
pub async fn reconcile(endpoints: &Endpoints, job: &str) -> anyhow::Result<String> {
    let c = open(endpoints, job, "minions reconcile").await?;
    let p = progress::load(&c.js, c.store.as_ref(), &c.job).await?;
    let failed: std::collections::HashSet<u32> = p.failed_shards.iter().map(|f| f.shard).collect();
    let work = c.js.get_stream(streams::WORK_STREAM).await?;
    let (mut republished, mut duplicates, mut ok) = (0u32, 0u32, 0u32);
    for s in 0..c.spec.shards {
        if failed.contains(&s) {
            continue;
        }
        if c.store
            .head(&StorePath::from(keys::shard_output(&c.job, s)))
            .await
            .is_ok()
        {
            ok += 1;
            continue;
        }
        if work
            .get_last_raw_message_by_subject(&subjects::work(&c.job, s))
            .await
            .is_ok()
        {
            ok += 1;
            continue;
        }
        if publish::task(&c.js, &c.spec.task(s), &subjects::msg_id(&c.job, s)).await? {
            republished += 1;
            tracing::warn!(job = %c.job, shard = s, "shard was neither done nor queued; republished");
        } else {
            duplicates += 1;
        }
    }
    let mut line = format!(
        "job {}: {ok} shards done or queued, {republished} republished",
        c.job
    );
    if duplicates > 0 {
        line.push_str(&format!(
            ", {duplicates} not republished: the stream saw their message ids within its duplicate window; run again later"
        ));
    }
    Ok(line)
}
