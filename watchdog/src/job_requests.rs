//! Acting on jobs for producers: a producer asks on
//! `minions.jobreq.<team>.<submitter>` ([`minions_schemas::messages::JobRequest`])
//! to cancel a job or retry its failed shards. The NATS server let a team
//! identity publish there only for its own teams and name, and it may not
//! purge the work queue or stop a job itself, so one watchdog of the queue
//! group acts, and only on a job whose spec names the team of the subject.

use std::sync::Arc;

use minions_endpoints::job_control;
use minions_schemas::messages::{JobAction, JobAnswer, JobRequest};
use minions_schemas::streams::WorkSettings;
use minions_schemas::{SCHEMA_VERSION, decode, limits, subjects};
use object_store::ObjectStore;
use tokio_util::sync::CancellationToken;

use crate::view::View;

/// Listens for job requests in the watchdogs' queue group; [`serve`]
/// answers them. Called before the watchdog says it is up.
pub async fn listen(
    client: &async_nats::Client,
) -> Result<async_nats::Subscriber, async_nats::SubscribeError> {
    client
        .queue_subscribe(
            subjects::JOB_REQUEST_ALL,
            subjects::WATCHDOG_GROUP.to_owned(),
        )
        .await
}

/// What acting on jobs needs.
pub struct Actor {
    /// Replies and cancellations go here.
    pub client: async_nats::Client,
    /// The work queue is purged, and shards queued, here.
    pub js: async_nats::jetstream::Context,
    /// Specs are read, and cancellation markers written, here.
    pub store: Arc<dyn ObjectStore>,
    /// Failed shards are read here.
    pub view: Arc<View>,
    /// The work stream's settings (a retried job's consumer).
    pub work: WorkSettings,
    /// This watchdog's name.
    pub me: String,
}

/// Answers the requests `sub` receives until `stop`.
pub async fn serve(actor: Actor, mut sub: async_nats::Subscriber, stop: CancellationToken) {
    while let Some((msg, reply)) = crate::reply::next_request(&mut sub, &stop).await {
        let outcome = actor.act(&msg.subject, &msg.payload).await;
        let answer = JobAnswer {
            v: SCHEMA_VERSION,
            done: outcome.is_ok(),
            detail: outcome.unwrap_or_else(|e| e),
            by: actor.me.clone(),
        };
        crate::reply::send(&actor.client, reply, "job answer", &answer).await;
    }
}

impl Actor {
    /// Does what `payload` asks on `subject`; what was done, or why not.
    async fn act(&self, subject: &str, payload: &[u8]) -> Result<String, String> {
        let (team, submitter) = subjects::parse_job_request(subject)
            .ok_or_else(|| format!("{subject} is not a job request subject"))?;
        let request: JobRequest = decode("job request", payload, limits::MAX_ADMISSION_BYTES)
            .map_err(|e| format!("the request does not decode: {e}"))?;
        let job = &request.job;
        let spec = crate::orphans::read_spec(self.store.as_ref(), job)
            .await
            .ok_or_else(|| format!("job {job}: its spec cannot be read from the store"))?;
        if spec.team != team {
            tracing::warn!(job = %job, team, submitter, "a job request for another team's job refused");
            return Err(format!(
                "job {job} is team {:?}'s; {submitter} asked for team {team:?}",
                spec.team
            ));
        }
        let done = match request.action {
            JobAction::Cancel => {
                let purged = job_control::cancel(&self.js, &self.client, self.store.as_ref(), job)
                    .await
                    .map_err(|e| e.to_string())?;
                format!("cancelled; {purged} pending shards removed, running shards stopped")
            }
            JobAction::Retry => {
                let failed = failed_shards(&self.view, job);
                if failed.is_empty() {
                    "no failed shards to retry".to_owned()
                } else {
                    let n = requeue(&self.js, &self.work, &spec, &failed).await?;
                    format!("{n} failed shards resubmitted")
                }
            }
        };
        tracing::info!(job = %job, team, submitter, action = request.action.as_str(), "job request done");
        Ok(done)
    }
}

/// The failed shards of `job` this watchdog knows of.
pub fn failed_shards(view: &View, job: &minions_schemas::JobId) -> Vec<u32> {
    let jobs = view.jobs();
    jobs.get(job).map_or_else(Vec::new, |j| {
        j.progress(minions_schemas::time::now_ms())
            .failed_shards
            .iter()
            .map(|f| f.shard)
            .collect()
    })
}

/// Queues `failed` shards of `spec`'s job again, its consumer made first
/// (it is removed once a job has nothing queued); how many were queued, or
/// why not.
pub async fn requeue(
    js: &async_nats::jetstream::Context,
    work: &WorkSettings,
    spec: &minions_schemas::messages::JobSpec,
    failed: &[u32],
) -> Result<u32, String> {
    minions_endpoints::queue::ensure_job_consumer(js, work, spec)
        .await
        .map_err(|e| format!("job {}: its consumer could not be made: {e}", spec.job))?;
    job_control::retry(js, spec, failed)
        .await
        .map_err(|e| e.to_string())
}
