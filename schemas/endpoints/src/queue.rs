//! The queue the contract's scheduling module describes: making each job's
//! consumers (their server configurations, created where missing), reading
//! every job with its counts and the team policies, and following
//! submits' nudges.

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use minions_schemas::messages::{JobSpec, QueuedJob};
use minions_schemas::scheduling::{JobConsumer, TEAMS_KEY, Teams, add_queued, queued_job};
use minions_schemas::streams::{WORK_STREAM, WorkSettings};

use crate::streams::EnsureError;

/// The server configuration of a job consumer: the work settings and `c`.
fn pull_config(settings: &WorkSettings, c: JobConsumer) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(c.name),
        description: Some(c.description),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: settings.ack_wait,
        max_deliver: settings.max_deliver,
        max_ack_pending: settings.max_ack_pending,
        max_waiting: settings.max_waiting,
        filter_subject: c.filter,
        num_replicas: settings.replicas,
        metadata: c.metadata,
        ..Default::default()
    }
}

/// The configuration of `spec`'s consumer ([`JobConsumer::of_job`]).
pub fn job_consumer_config(settings: &WorkSettings, spec: &JobSpec) -> consumer::pull::Config {
    pull_config(settings, JobConsumer::of_job(spec))
}

/// The configuration of `spec`'s check consumer ([`JobConsumer::of_checks`]).
pub fn check_consumer_config(settings: &WorkSettings, spec: &JobSpec) -> consumer::pull::Config {
    pull_config(settings, JobConsumer::of_checks(spec))
}

/// Creates `spec`'s consumer where missing (the same spec makes the same
/// consumer, so a re-submit changes nothing) and returns it.
pub async fn ensure_job_consumer(
    js: &jetstream::Context,
    settings: &WorkSettings,
    spec: &minions_schemas::messages::JobSpec,
) -> Result<consumer::PullConsumer, EnsureError> {
    ensure_consumer(js, settings, spec, false).await
}

/// Creates `spec`'s check consumer where missing and returns it. Fails
/// where the job's consumer takes every subject of the job (made before
/// check runs had their own); their check runs then go on the job's own
/// subjects.
pub async fn ensure_check_consumer(
    js: &jetstream::Context,
    settings: &WorkSettings,
    spec: &minions_schemas::messages::JobSpec,
) -> Result<consumer::PullConsumer, EnsureError> {
    ensure_consumer(js, settings, spec, true).await
}

async fn ensure_consumer(
    js: &jetstream::Context,
    settings: &WorkSettings,
    spec: &minions_schemas::messages::JobSpec,
    checks: bool,
) -> Result<consumer::PullConsumer, EnsureError> {
    let name = if checks {
        minions_schemas::scheduling::check_consumer(&spec.job)
    } else {
        minions_schemas::scheduling::job_consumer(&spec.job)
    };
    // A team's quota caps each of its jobs exactly (the server counts the
    // job's unacknowledged deliveries); across several jobs of the team the
    // schedule keeps it. Unreadable policies cap nothing.
    let quota = match read_teams(js).await {
        Ok((teams, _)) => teams.teams.get(&spec.team).map_or(0, |p| p.quota),
        Err(e) => {
            tracing::debug!(error = %e, "team policies unreadable; the job's consumer is not capped");
            0
        }
    };
    let settings = &WorkSettings {
        max_ack_pending: if quota > 0 {
            settings.max_ack_pending.min(i64::from(quota))
        } else {
            settings.max_ack_pending
        },
        ..settings.clone()
    };
    let config = if checks {
        check_consumer_config(settings, spec)
    } else {
        job_consumer_config(settings, spec)
    };
    crate::resilient::patiently(
        "creating the job's consumer",
        crate::resilient::PATIENCE,
        || async {
            let work = js
                .get_stream(WORK_STREAM)
                .await
                .map_err(|e| EnsureError::WorkStream(e.to_string()))?;
            work.get_or_create_consumer(&name, config.clone())
                .await
                .map_err(|source| EnsureError::Consumer {
                    name: name.clone(),
                    source,
                })
        },
    )
    .await
}

/// A scheduler's word of submits ([`minions_schemas::subjects::QUEUED`]): a job was
/// just queued, so read the queue now rather than at the next tick.
/// Without a subscription (it failed) no word ever comes and the tick
/// alone schedules.
pub struct Nudges(Option<async_nats::Subscriber>);

impl Nudges {
    /// Follows submits' nudges on `client`; a failed subscription is
    /// logged and leaves the tick alone.
    pub async fn follow(client: &async_nats::Client) -> Self {
        match client.subscribe(minions_schemas::subjects::QUEUED).await {
            Ok(s) => Self(Some(s)),
            Err(e) => {
                tracing::warn!(error = %e, "not following submits; new jobs wait for the tick");
                Self(None)
            }
        }
    }

    /// Waits for the next nudge (its payload is not read); never returns
    /// once the subscription has ended.
    pub async fn next(&mut self) {
        match self.0.as_mut() {
            Some(s) => {
                if s.next().await.is_none() {
                    self.0 = None;
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

/// Why the queue could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot list the work consumers: {0}")]
pub struct ScheduleError(pub String);

/// How long a reader of the queue waits for the list of consumers before
/// the last one it read stands in. A list takes milliseconds, but while a
/// job consumer's leader is being elected (4 to 9 s after its server is
/// lost) the server waits about 4 s for that consumer, then reports it
/// missing: waiting would stop the schedule, and a list without the job
/// would stop workers pulling it, for the whole election.
pub const LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// How long the last list read stands in for lists that do not come in
/// time; after it, the reader waits for a list however long it takes.
pub const LIST_STANDS: std::time::Duration = std::time::Duration::from_secs(30);

/// The last reading of the queue that succeeded, standing in for readings
/// slower than [`LIST_WAIT`] for up to [`LIST_STANDS`] (the watchdog's
/// schedule and a worker reading the queue itself both use it).
#[derive(Debug)]
pub struct Standing<T> {
    last: Option<(std::time::Instant, T)>,
}

impl<T> Default for Standing<T> {
    fn default() -> Self {
        Self { last: None }
    }
}

/// What [`Standing::read`] got.
#[derive(Debug)]
pub enum Reading<T, E> {
    /// A reading made now.
    Fresh(T),
    /// The reading was slow: the last one stands.
    Stands(T),
    /// The reading failed.
    Failed(E),
}

impl<T: Clone> Standing<T> {
    /// Runs `read`: given [`LIST_WAIT`] while a recent reading can stand
    /// in for it, else as long as it takes.
    pub async fn read<E>(
        &mut self,
        read: impl std::future::Future<Output = Result<T, E>>,
    ) -> Reading<T, E> {
        let stand_in = self
            .last
            .as_ref()
            .filter(|(at, _)| at.elapsed() < LIST_STANDS)
            .map(|(_, v)| v.clone());
        let got = match stand_in {
            Some(v) => match tokio::time::timeout(LIST_WAIT, read).await {
                Ok(got) => got,
                Err(_) => return Reading::Stands(v),
            },
            None => read.await,
        };
        match got {
            Ok(v) => {
                self.last = Some((std::time::Instant::now(), v.clone()));
                Reading::Fresh(v)
            }
            Err(e) => Reading::Failed(e),
        }
    }
}

/// Every job of the work stream with a consumer, with its counts: a job's
/// check consumer counts under the job.
pub async fn list_jobs(js: &jetstream::Context) -> Result<Vec<QueuedJob>, ScheduleError> {
    let stream = js
        .get_stream(WORK_STREAM)
        .await
        .map_err(|e| ScheduleError(e.to_string()))?;
    let mut infos = stream.consumers();
    let mut jobs: Vec<QueuedJob> = Vec::new();
    while let Some(info) = infos.next().await {
        let info = info.map_err(|e| ScheduleError(e.to_string()))?;
        let counts = (info.num_pending, info.num_ack_pending as u64);
        if let Some(q) = queued_job(&info.config.metadata, counts.0, counts.1) {
            add_queued(&mut jobs, q);
        }
    }
    Ok(jobs)
}

/// Reads the team policies with their KV revision (`Teams::default()` and 0
/// when none are stored). Errors: the bucket is unreadable or the record is
/// damaged.
pub async fn read_teams(js: &jetstream::Context) -> Result<(Teams, u64), ScheduleError> {
    let kv = crate::streams::teams_kv(js, 1)
        .await
        .map_err(|e| ScheduleError(e.to_string()))?;
    match kv.entry(TEAMS_KEY).await {
        Ok(Some(e)) if e.operation == jetstream::kv::Operation::Put => {
            let teams = minions_schemas::decode::<Teams>(
                "team policies",
                &e.value,
                minions_schemas::limits::MAX_TEAM_POLICY_BYTES * 256,
            )
            .map_err(|e| ScheduleError(e.to_string()))?;
            Ok((teams, e.revision))
        }
        Ok(Some(e)) => Ok((Teams::default(), e.revision)),
        Ok(None) => Ok((Teams::default(), 0)),
        Err(e) => Err(ScheduleError(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first reading waits as long as it takes; a later one slower
    /// than [`LIST_WAIT`] gives the last reading; a failure is passed on.
    #[tokio::test]
    async fn a_slow_reading_leaves_the_last_one_standing() {
        let mut s = Standing::default();
        let slow = |v: u32| async move {
            tokio::time::sleep(LIST_WAIT + std::time::Duration::from_millis(200)).await;
            Ok::<u32, String>(v)
        };
        assert!(matches!(s.read(slow(1)).await, Reading::Fresh(1)));
        assert!(matches!(s.read(slow(2)).await, Reading::Stands(1)));
        assert!(matches!(
            s.read(async { Ok::<u32, String>(3) }).await,
            Reading::Fresh(3)
        ));
        assert!(matches!(
            s.read(async { Err::<u32, String>("down".into()) }).await,
            Reading::Failed(e) if e == "down"
        ));
    }
}
