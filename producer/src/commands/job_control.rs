//! `minions retry`, `minions cancel` and `minions reconcile`: acting on a
//! job's shards after submit. Cancel and retry ask the watchdogs first (on
//! the job's team, as this identity: how a team's identity acts, since it
//! may not purge the queue or stop a job itself) and act here only when no
//! watchdog listens.

use anyhow::Context;
use async_nats::jetstream;
use minions_endpoints::job_control;
use minions_schemas::messages::{ActionKind, JobAction, JobSpec};
use minions_schemas::{JobId, keys, streams, subjects};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::cli::Endpoints;
use crate::progress;
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
    Ok(Ctx {
        js,
        client,
        store,
        job,
        spec,
    })
}

/// Makes the job's consumer (removed once a job has nothing queued) before
/// shards are queued again from here.
async fn ensure_consumer(endpoints: &Endpoints, c: &Ctx) -> anyhow::Result<()> {
    let settings =
        minions_endpoints::streams::ensure(&c.js, &endpoints.replication.work_settings()).await?;
    minions_endpoints::queue::ensure_job_consumer(&c.js, &settings, &c.spec).await?;
    Ok(())
}

/// Asks a watchdog to do `action` on the job for its team as this
/// identity: its answer in words, or `None` when no watchdog listens.
async fn ask_watchdog(
    endpoints: &Endpoints,
    c: &Ctx,
    action: JobAction,
) -> anyhow::Result<Option<String>> {
    let by = endpoints.security.identity_name();
    let answer = job_control::ask(&c.client, &c.spec.team, &by, &c.job, action).await?;
    Ok(answer.map(|a| format!("job {}: {} (by watchdog {})", c.job, a.detail, a.by)))
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
    if let Some(said) = ask_watchdog(endpoints, &c, JobAction::Retry).await? {
        return Ok(said);
    }
    ensure_consumer(endpoints, &c).await?;
    let failed: Vec<u32> = p.failed_shards.iter().map(|f| f.shard).collect();
    let n = job_control::retry(&c.js, &c.spec, &failed).await?;
    Ok(format!("job {}: {n} failed shards resubmitted", c.job))
}

/// Cancels a job: marks it cancelled, removes its pending shards, and tells
/// workers to stop the running ones.
pub async fn cancel(endpoints: &Endpoints, job: &str) -> anyhow::Result<String> {
    let c = open(endpoints, job, "minions cancel").await?;
    super::audit::record(endpoints, &c.js, ActionKind::Cancel, c.job.as_str(), "").await?;
    if let Some(said) = ask_watchdog(endpoints, &c, JobAction::Cancel).await? {
        return Ok(said);
    }
    let purged = job_control::cancel(&c.js, &c.client, c.store.as_ref(), &c.job).await?;
    Ok(format!(
        "job {}: cancelled; {purged} pending shards removed, running shards stopped",
        c.job
    ))
}

/// Republishes every shard that is neither done, queued nor failed, under
/// its original message id (so two reconcilers cannot queue it twice).
pub async fn reconcile(endpoints: &Endpoints, job: &str) -> anyhow::Result<String> {
    let c = open(endpoints, job, "minions reconcile").await?;
    ensure_consumer(endpoints, &c).await?;
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
        if job_control::publish_task(&c.js, &c.spec.task(s), &subjects::msg_id(&c.job, s)).await? {
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
