//! Acting on a job after submit, for the CLI, the dashboard and the
//! watchdog that answers a team identity's request alike: [`cancel`] a
//! job, [`retry`] its failed shards, and [`ask`] a watchdog to do either
//! (how a team's identity acts: it may not purge the queue or stop a job
//! itself). The caller puts the action on record first.

use std::time::Duration;

use async_nats::jetstream;
use minions_schemas::messages::{
    EventKind, JobAction, JobAnswer, JobRequest, JobSpec, ShardEvent, ShardTask,
};
use minions_schemas::{JobId, SCHEMA_VERSION, decode, encode, keys, limits, streams, subjects};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutMode, PutOptions};

use crate::nats::Asked;
use crate::resilient;

/// How long a watchdog has to answer a job request.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// Why acting on a job failed.
#[derive(Debug, thiserror::Error)]
pub enum JobControlError {
    /// A message does not encode or decode.
    #[error("{0}")]
    Wire(String),
    /// The store refused or failed.
    #[error("{what}: {source}")]
    Store {
        /// What was being done.
        what: String,
        /// Why.
        source: object_store::Error,
    },
    /// NATS refused or failed.
    #[error("{what}: {reason}")]
    Nats {
        /// What was being done.
        what: String,
        /// Why.
        reason: String,
    },
    /// The NATS server refused the request (the identity may not act for
    /// that team).
    #[error(
        "the NATS server refused identity {by:?} to act on jobs of team {team:?} (its identity covers other teams)"
    )]
    Refused {
        /// The identity.
        by: String,
        /// The team.
        team: String,
    },
    /// A watchdog refused it.
    #[error("watchdog {by} refused: {detail}")]
    NotDone {
        /// The watchdog.
        by: String,
        /// Why.
        detail: String,
    },
}

fn nats(what: &str, e: impl std::fmt::Display) -> JobControlError {
    JobControlError::Nats {
        what: what.to_owned(),
        reason: e.to_string(),
    }
}

/// Publishes one shard task under `msg_id`; true when the stream stored it
/// (false: a duplicate of a message id it has seen within its window).
pub async fn publish_task(
    js: &jetstream::Context,
    task: &ShardTask,
    msg_id: &str,
) -> Result<bool, JobControlError> {
    let payload = encode("shard task", task).map_err(|e| JobControlError::Wire(e.to_string()))?;
    let ack = resilient::publish_once(
        js,
        &subjects::work(&task.job, task.shard),
        msg_id,
        payload.into(),
    )
    .await
    .map_err(|e| {
        nats(
            &format!(
                "the work stream did not confirm shard {} of job {}",
                task.shard, task.job
            ),
            e,
        )
    })?;
    Ok(!ack.duplicate)
}

/// Publishes an event about a shard on behalf of the CLI (its sender is
/// `cli`, whoever publishes it).
pub async fn publish_event(
    js: &jetstream::Context,
    job: &JobId,
    shard: u32,
    kind: EventKind,
) -> Result<(), JobControlError> {
    let e = ShardEvent::by_cli(job.clone(), shard, kind)
        .map_err(|e| JobControlError::Wire(e.to_string()))?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, e.msg_id().as_str());
    let payload = encode("shard event", &e).map_err(|e| JobControlError::Wire(e.to_string()))?;
    resilient::publish_confirmed(
        js,
        &subjects::event(job, shard, &e.worker),
        headers,
        payload.into(),
        resilient::PATIENCE,
    )
    .await
    .map_err(|e| nats("the events stream did not confirm", e))?;
    Ok(())
}

/// Cancels `job`: writes its cancellation marker (create-only; one there
/// already is fine), drops its queued shards and tells workers to stop its
/// running ones. Returns how many queued shards were dropped.
pub async fn cancel(
    js: &jetstream::Context,
    client: &async_nats::Client,
    store: &dyn ObjectStore,
    job: &JobId,
) -> Result<u64, JobControlError> {
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store
        .put_opts(
            &StorePath::from(keys::job_cancelled(job)),
            bytes::Bytes::new().into(),
            opts,
        )
        .await
    {
        Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
        Err(source) => {
            return Err(JobControlError::Store {
                what: "writing the cancellation marker".into(),
                source,
            });
        }
    }
    let work = js
        .get_stream(streams::WORK_STREAM)
        .await
        .map_err(|e| nats("the work stream", e))?;
    let purged = work
        .purge()
        .filter(subjects::job_work(job))
        .await
        .map_err(|e| nats("removing pending shards", e))?
        .purged;
    client
        .publish(subjects::cancel(job), bytes::Bytes::new())
        .await
        .map_err(|e| nats("telling workers", e))?;
    client
        .flush()
        .await
        .map_err(|e| nats("telling workers", e))?;
    tracing::info!(job = %job, purged, "job cancelled");
    Ok(purged)
}

/// Queues `failed` shards of the job `spec` describes again (each under a
/// new message id, after a `requeued` event). Returns how many were queued.
pub async fn retry(
    js: &jetstream::Context,
    spec: &JobSpec,
    failed: &[u32],
) -> Result<u32, JobControlError> {
    let nonce = ulid::Ulid::new().to_string().to_lowercase();
    let mut n = 0;
    for &shard in failed {
        publish_event(js, &spec.job, shard, EventKind::Requeued).await?;
        let msg_id = format!("{}/retry-{nonce}", subjects::msg_id(&spec.job, shard));
        if publish_task(js, &spec.task(shard), &msg_id).await? {
            n += 1;
        }
    }
    tracing::info!(job = %spec.job, shards = n, "failed shards resubmitted");
    Ok(n)
}

/// Asks the watchdogs to `action` `job`, for `team` as `by`. `Ok(None)`:
/// no watchdog listens (the caller may act itself, if it may).
pub async fn ask(
    client: &async_nats::Client,
    team: &str,
    by: &str,
    job: &JobId,
    action: JobAction,
) -> Result<Option<JobAnswer>, JobControlError> {
    let request = JobRequest {
        v: SCHEMA_VERSION,
        job: job.clone(),
        action,
    };
    let payload =
        encode("job request", &request).map_err(|e| JobControlError::Wire(e.to_string()))?;
    let subject = subjects::job_request(team, by);
    let reply =
        match crate::nats::request_watched(client, subject, payload.into(), ANSWER_WITHIN).await {
            Asked::Answer(m) => m,
            Asked::Refused => {
                return Err(JobControlError::Refused {
                    by: by.to_owned(),
                    team: team.to_owned(),
                });
            }
            Asked::NoResponders => return Ok(None),
            Asked::TimedOut => {
                return Err(nats(
                    "asking a watchdog",
                    format!("no answer within {} s", ANSWER_WITHIN.as_secs()),
                ));
            }
            Asked::Failed(e) => return Err(nats("asking a watchdog", e)),
        };
    let answer: JobAnswer = decode("job answer", &reply.payload, limits::MAX_ADMISSION_BYTES)
        .map_err(|e| JobControlError::Wire(e.to_string()))?;
    if !answer.done {
        return Err(JobControlError::NotDone {
            by: answer.by,
            detail: answer.detail,
        });
    }
    Ok(Some(answer))
}
