//! Cancellations a worker did not hear: a job's cancellation is broadcast on
//! core NATS once, so a worker disconnected at that moment would run its
//! shard of the job to the end. Every `--cancel-check-secs`, the worker reads the
//! `cancelled` marker (`jobs/JOB/cancelled` in the store) of each job it is
//! running and stops that job's shards when the marker is there.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use minions_schemas::{JobId, keys};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;

/// Reads the markers of running jobs every `every` until `stop`.
pub(crate) async fn watch(ctx: Arc<Ctx>, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let jobs: BTreeSet<JobId> = ctx
            .running
            .in_flight()
            .into_iter()
            .map(|i| i.job)
            .filter(|j| !ctx.running.is_cancelled(j.as_str()))
            .collect();
        for job in jobs {
            match ctx
                .store
                .head(&StorePath::from(keys::job_cancelled(&job)))
                .await
            {
                Ok(_) => {
                    let n = ctx.running.cancel_job(job.as_str());
                    tracing::info!(job = %job, stopped = n, "job cancelled (its cancellation marker is in the store)");
                }
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    tracing::debug!(job = %job, error = %e, "cancellation marker not readable");
                }
            }
        }
    }
}
