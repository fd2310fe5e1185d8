//! Which job a free slot pulls from: the latest schedule (the watchdog's, or
//! one this worker reads itself when no watchdog publishes), what this
//! worker did since, and a cache of job consumers. The rule itself is
//! [`minions_schemas::scheduling::pick`], shared with the watchdog.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures::StreamExt;
use minions_schemas::messages::Schedule;
use minions_schemas::scheduling::{self, Lender, Since, Tiers, Turn};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, limits, streams, subjects};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;

/// After this long without a watchdog's schedule, a worker reads the queue
/// itself.
const WATCHDOG_SILENCE: Duration = Duration::from_secs(2);
/// How often a worker reads the queue itself while no watchdog publishes.
const OWN_READ_EVERY: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A worker's view of what is queued.
pub(crate) struct Scheduler {
    current: watch::Sender<Arc<Schedule>>,
    since: Mutex<Since>,
    /// Consumers looked up: (job, of its check runs) to consumer.
    consumers: Mutex<HashMap<(JobId, bool), PullConsumer>>,
    /// Jobs whose check consumer had nothing this worker may run, since
    /// the latest schedule.
    checks_seen: Mutex<std::collections::HashSet<JobId>>,
    /// Memory this worker lends to models, MB (0 = unknown).
    pub(crate) lend_mb: u64,
    /// How often a schedule arrives, ms (the watchdog's period, or this
    /// worker's own reading).
    period_ms: std::sync::atomic::AtomicU64,
}

impl Scheduler {
    /// An empty view; `lend_mb` is the memory this worker lends.
    pub(crate) fn new(lend_mb: u64) -> Self {
        Self {
            current: watch::Sender::new(Arc::new(scheduling::build(
                0,
                Vec::new(),
                &Default::default(),
                &HashMap::new(),
            ))),
            since: Mutex::new(Since::default()),
            consumers: Mutex::new(HashMap::new()),
            checks_seen: Mutex::new(Default::default()),
            lend_mb,
            period_ms: std::sync::atomic::AtomicU64::new(OWN_READ_EVERY.as_millis() as u64),
        }
    }

    fn lender(&self, ctx: &Ctx) -> Lender {
        Lender {
            memory_mb: self.lend_mb,
            device: ctx.device.clone(),
            cached: ctx.cache.held(),
        }
    }

    /// Takes a new schedule: what this worker did before it is in it.
    fn set(&self, schedule: Schedule) {
        *lock(&self.since) = Since::default();
        lock(&self.checks_seen).clear();
        self.current.send_replace(Arc::new(schedule));
    }

    /// The job a free slot should pull from now, if any, and its team;
    /// `previous_team` is the team of the slot's last shard.
    pub(crate) fn pick(&self, ctx: &Ctx, previous_team: Option<&str>) -> Option<(JobId, String)> {
        let schedule = self.current.borrow().clone();
        let running: u64 = schedule.jobs.iter().map(|j| j.running).sum();
        let mean_ms = ctx.mean_shard_ms.load(std::sync::atomic::Ordering::Relaxed);
        let period_ms = self.period_ms.load(std::sync::atomic::Ordering::Relaxed);
        let turn = Turn {
            previous_team: previous_team.map(str::to_owned),
            // Slots that free before the next schedule, and idle ones, which
            // pick as soon as it arrives.
            spread: schedule.idle as f64
                + if mean_ms == 0 {
                    1.0
                } else {
                    running as f64 * period_ms as f64 / mean_ms as f64
                },
            dice: fastrand::f64(),
            quota_dice: fastrand::f64(),
        };
        // Read under the lock (the rule is pure and quick) rather than a
        // copy of the maps made for every pick.
        let job = {
            let since = lock(&self.since);
            scheduling::pick(&schedule, &self.lender(ctx), &since, Tiers::All, &turn)?
        };
        let team = schedule
            .jobs
            .iter()
            .find(|j| j.job == job)
            .map(|j| j.team.clone())
            .unwrap_or_default();
        Some((job, team))
    }

    /// A slot started (`+1`) or finished (`-1`) a shard of `job`.
    pub(crate) fn count(&self, job: &JobId, delta: i64) {
        *lock(&self.since).started.entry(job.clone()).or_default() += delta;
    }

    /// `job`'s consumer had nothing to deliver: skip it until the next
    /// schedule.
    pub(crate) fn mark_empty(&self, job: &JobId) {
        lock(&self.since).empty.insert(job.clone());
    }

    /// Whether a slot that picked `job` should first pull from its check
    /// consumer: the schedule says check runs wait, and none that this
    /// worker may run was missing from it since.
    pub(crate) fn checks_waiting(&self, job: &JobId) -> bool {
        let schedule = self.current.borrow().clone();
        schedule.jobs.iter().any(|j| &j.job == job && j.checks > 0)
            && !lock(&self.checks_seen).contains(job)
    }

    /// `job`'s check consumer had nothing, or only a check run this
    /// machine must not run: pull the job's shards until the next schedule.
    pub(crate) fn mark_checks_seen(&self, job: &JobId) {
        lock(&self.checks_seen).insert(job.clone());
    }

    /// Waits until a new schedule arrives or `within` passes.
    pub(crate) async fn changed(&self, within: Duration) {
        let mut rx = self.current.subscribe();
        rx.mark_unchanged();
        let _ = tokio::time::timeout(within, rx.changed()).await;
    }

    /// `job`'s consumer of its shards, or of its check runs when `checks`
    /// (looked up once, then kept).
    pub(crate) async fn consumer(
        &self,
        js: &jetstream::Context,
        job: &JobId,
        checks: bool,
    ) -> Result<PullConsumer, String> {
        let key = (job.clone(), checks);
        if let Some(c) = lock(&self.consumers).get(&key) {
            return Ok(c.clone());
        }
        let stream = js
            .get_stream(streams::WORK_STREAM)
            .await
            .map_err(|e| e.to_string())?;
        let name = if checks {
            scheduling::check_consumer(job)
        } else {
            scheduling::job_consumer(job)
        };
        let c: PullConsumer = stream
            .get_consumer(&name)
            .await
            .map_err(|e| e.to_string())?;
        let mut all = lock(&self.consumers);
        // Forget consumers of jobs no longer queued.
        let schedule = self.current.borrow().clone();
        all.retain(|(j, _), _| schedule.jobs.iter().any(|q| &q.job == j));
        all.insert(key, c.clone());
        Ok(c)
    }

    /// Forgets `job`'s consumers (one failed; it may have been removed).
    pub(crate) fn forget(&self, job: &JobId) {
        lock(&self.consumers).retain(|(j, _), _| j != job);
    }

    /// Preemption: with the schedule's probability, hands back each running
    /// shard of a preemptible job, when work that is not preemptible waits
    /// for a worker like this one.
    fn preempt(&self, ctx: &Ctx, schedule: &Schedule) {
        if schedule.preempt <= 0.0 {
            return;
        }
        let regular = scheduling::pick(
            schedule,
            &self.lender(ctx),
            &Since::default(),
            Tiers::RegularOnly,
            &Turn::eager(),
        );
        let Some(wanted) = regular else { return };
        for f in ctx.in_flight() {
            let preemptible = schedule
                .jobs
                .iter()
                .any(|j| j.job == f.job && j.preemptible);
            if preemptible && fastrand::f64() < schedule.preempt {
                tracing::info!(job = %f.job, shard = f.shard, for_job = %wanted, "preempted: handing the shard back");
                ctx.preempt_shard(f.job.as_str(), f.shard);
            }
        }
    }
}

/// Follows the watchdog's schedule until `stop`; reads the queue itself
/// while none arrives.
pub(crate) async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let mut sub = match ctx.client.subscribe(subjects::SCHEDULE).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot follow the schedule; reading the queue directly");
            None
        }
    };
    // A submit's nudge: with no watchdog to follow, the queue is read at
    // once, so a new job starts without waiting for the tick.
    let mut queued = minions_endpoints::queue::Nudges::follow(&ctx.client).await;
    let mut last_remote = tokio::time::Instant::now() - WATCHDOG_SILENCE;
    let mut own = tokio::time::interval(OWN_READ_EVERY);
    own.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            msg = async {
                match sub.as_mut() {
                    Some(s) => s.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let Some(msg) = msg else { sub = None; continue };
                match minions_schemas::decode::<Schedule>("schedule", &msg.payload, limits::MAX_SCHEDULE_BYTES) {
                    Ok(s) => {
                        let now = tokio::time::Instant::now();
                        let gap = now.duration_since(last_remote).min(OWN_READ_EVERY);
                        ctx.sched.period_ms.store(gap.as_millis().max(50) as u64, std::sync::atomic::Ordering::Relaxed);
                        last_remote = now;
                        ctx.sched.preempt(&ctx, &s);
                        ctx.sched.set(s);
                    }
                    Err(e) => tracing::warn!(error = %e, "ignoring a schedule that does not decode"),
                }
            }
            () = queued.next() => {
                // The watchdog, where one publishes, answers the nudge.
                if last_remote.elapsed() >= WATCHDOG_SILENCE {
                    own.reset_immediately();
                }
            }
            _ = own.tick() => {
                if last_remote.elapsed() < WATCHDOG_SILENCE {
                    continue;
                }
                match read_own(&ctx.js).await {
                    Ok(s) => {
                        ctx.sched.period_ms.store(OWN_READ_EVERY.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
                        ctx.sched.set(s);
                    }
                    Err(e) => tracing::debug!(error = %e, "cannot read the queue"),
                }
            }
        }
    }
}

/// A schedule read straight from the queue (no usage history).
async fn read_own(
    js: &jetstream::Context,
) -> Result<Schedule, minions_endpoints::queue::ScheduleError> {
    let jobs = minions_endpoints::queue::list_jobs(js).await?;
    let teams = match minions_endpoints::queue::read_teams(js).await {
        Ok((t, _)) => t,
        Err(e) => {
            tracing::debug!(error = %e, "team policies unreadable; teams share equally");
            Default::default()
        }
    };
    Ok(scheduling::build(now_ms(), jobs, &teams, &HashMap::new()))
}
