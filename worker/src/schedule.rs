//! Which job a free slot pulls from: the latest schedule (the watchdog's, or
//! one this worker reads itself when no watchdog publishes), what this
//! worker did since, and a cache of job consumers. The rule itself is
//! [`minions_schemas::scheduling::pick`], shared with the watchdog.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer, consumer::pull};
use minions_schemas::messages::Schedule;
use minions_schemas::scheduling::{self, Lender, Since, Tiers, Turn};
use minions_schemas::{JobId, ModelHash, streams};
use tokio::sync::watch;

use crate::lock::lock;
use crate::running::RunningTable;

/// How long a slot waits for a job consumer's lookup before it gives up
/// until the next schedule (a lookup takes milliseconds but goes
/// unanswered while the consumer's leader is being elected).
const LOOKUP_WAIT: Duration = Duration::from_secs(1);

/// How often a worker reads the queue itself while no watchdog publishes
/// (the period a new scheduler assumes).
pub(crate) const OWN_READ_EVERY: Duration = Duration::from_secs(1);

/// How long a job marked empty (its consumer had nothing, or did not
/// answer) is skipped when no new schedule comes: a schedule every 250 ms
/// clears the marks sooner; while none comes (the watchdog's list of
/// consumers waits on a leader election), slots ask again this often.
const MARKS_LAST: Duration = Duration::from_secs(1);

/// A worker's view of what is queued.
pub(crate) struct Scheduler {
    current: watch::Sender<Arc<Schedule>>,
    since: Mutex<Since>,
    /// Consumers looked up: (job, of its check runs) to consumer.
    consumers: Mutex<HashMap<(JobId, bool), PullConsumer>>,
    /// Jobs whose check consumer had nothing this worker may run, since
    /// the latest schedule.
    checks_seen: Mutex<std::collections::HashSet<JobId>>,
    /// When the empty and checks-seen marks were last cleared.
    marks_cleared: Mutex<std::time::Instant>,
    /// Memory this worker lends to models, MB (0 = unknown).
    pub(crate) lend_mb: u64,
    /// The device kind shards run on, as jobs' needs name it.
    device: String,
    /// How often a schedule arrives, ms (the watchdog's period, or this
    /// worker's own reading).
    period_ms: AtomicU64,
    /// The job whose group this worker leads: its slots pull that job only.
    leads: Mutex<Option<JobId>>,
    /// It serves a later stage of a group: its slots pull nothing.
    serving: std::sync::atomic::AtomicBool,
}

impl Scheduler {
    /// An empty view; `lend_mb` is the memory this worker lends, `device`
    /// what it runs shards on.
    pub(crate) fn new(lend_mb: u64, device: String) -> Self {
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
            marks_cleared: Mutex::new(std::time::Instant::now()),
            lend_mb,
            device,
            period_ms: AtomicU64::new(OWN_READ_EVERY.as_millis() as u64),
            leads: Mutex::new(None),
            serving: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lender(&self, cached: HashSet<ModelHash>) -> Lender {
        Lender {
            memory_mb: self.lend_mb,
            device: self.device.clone(),
            cached,
            leads: lock(&self.leads).clone(),
        }
    }

    /// Makes this worker's slots pull `job` only (it leads that job's
    /// group), or, with `None`, any job it can run alone.
    pub(crate) fn set_lead(&self, job: Option<JobId>) {
        *lock(&self.leads) = job;
    }

    /// Makes this worker's slots pull nothing while it serves a stage of a
    /// group (its memory holds the stage), or any job again.
    pub(crate) fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Relaxed);
    }

    /// Takes a new schedule (`period` after the one before): what this
    /// worker did before it is in it.
    pub(crate) fn set(&self, schedule: Schedule, period: Duration) {
        self.period_ms
            .store(period.as_millis().max(50) as u64, Ordering::Relaxed);
        *lock(&self.since) = Since::default();
        lock(&self.checks_seen).clear();
        *lock(&self.marks_cleared) = std::time::Instant::now();
        self.current.send_replace(Arc::new(schedule));
    }

    /// The job a free slot should pull from now, if any, and its team;
    /// `cached` are the models this worker holds, `mean_ms` its mean shard
    /// time (0: none yet), `previous_team` the team of the slot's last
    /// shard; `only_model`, when set, keeps to that model's jobs.
    pub(crate) fn pick(
        &self,
        cached: HashSet<ModelHash>,
        mean_ms: u64,
        previous_team: Option<&str>,
        only_model: Option<&ModelHash>,
    ) -> Option<(JobId, String)> {
        if self.serving.load(Ordering::Relaxed) {
            return None;
        }
        self.clear_old_marks();
        let current = self.current.borrow().clone();
        let filtered;
        let schedule: &Schedule = match only_model {
            Some(model) => {
                // An extra pull for the running batch: its model's jobs alone.
                let mut s = (*current).clone();
                s.jobs.retain(|j| &j.model_hash == model);
                filtered = s;
                &filtered
            }
            None => &current,
        };
        let running: u64 = schedule.jobs.iter().map(|j| j.running).sum();
        let period_ms = self.period_ms.load(Ordering::Relaxed);
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
            scheduling::pick(schedule, &self.lender(cached), &since, Tiers::All, &turn)?
        };
        let team = schedule
            .jobs
            .iter()
            .find(|j| j.job == job)
            .map(|j| j.team.clone())
            .unwrap_or_default();
        Some((job, team))
    }

    /// Clears the empty and checks-seen marks made more than
    /// [`MARKS_LAST`] ago when no schedule cleared them since.
    fn clear_old_marks(&self) {
        let mut cleared = lock(&self.marks_cleared);
        if cleared.elapsed() >= MARKS_LAST {
            lock(&self.since).empty.clear();
            lock(&self.checks_seen).clear();
            *cleared = std::time::Instant::now();
        }
    }

    /// A slot started (`+1`) or finished (`-1`) a shard of `job`.
    pub(crate) fn count(&self, job: &JobId, delta: i64) {
        *lock(&self.since).started.entry(job.clone()).or_default() += delta;
    }

    /// `job`'s consumer had nothing to deliver (or did not answer): skip
    /// it until the next schedule, or for [`MARKS_LAST`] while none comes.
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
        let name = if checks {
            scheduling::check_consumer(job)
        } else {
            scheduling::job_consumer(job)
        };
        // One request, answered in milliseconds by the consumer's leader.
        // While its leader is being elected (4 to 9 s after a server is
        // lost) nobody answers: waiting out the client's 5 s timeout would
        // add up to 5 s to the pause once the leader is back, so the
        // lookup gives up sooner and the next schedule asks again.
        let lookup = js.get_consumer_from_stream::<pull::Config, _, _>(&name, streams::WORK_STREAM);
        let c: PullConsumer = tokio::time::timeout(LOOKUP_WAIT, lookup)
            .await
            .map_err(|_| format!("no answer within {} ms", LOOKUP_WAIT.as_millis()))?
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

    /// Preemption: with the schedule's probability, hands back each of
    /// `running`'s shards of a preemptible job, when work that is not
    /// preemptible waits for a worker like this one (holding `cached`).
    pub(crate) fn preempt(
        &self,
        schedule: &Schedule,
        cached: HashSet<ModelHash>,
        running: &RunningTable,
    ) {
        if schedule.preempt <= 0.0 {
            return;
        }
        let regular = scheduling::pick(
            schedule,
            &self.lender(cached),
            &Since::default(),
            Tiers::RegularOnly,
            &Turn::eager(),
        );
        let Some(wanted) = regular else { return };
        for f in running.in_flight() {
            let preemptible = schedule
                .jobs
                .iter()
                .any(|j| j.job == f.job && j.preemptible);
            if preemptible && fastrand::f64() < schedule.preempt {
                tracing::info!(job = %f.job, shard = f.shard, for_job = %wanted, "preempted: handing the shard back");
                running.preempt_shard(f.job.as_str(), f.shard);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use minions_schemas::messages::{Priority, QueuedJob, Requirements};

    use super::*;

    type Res = Result<(), Box<dyn std::error::Error>>;

    fn queued(
        job: &str,
        team: &str,
        memory_mb: u64,
        checks: u64,
    ) -> Result<QueuedJob, Box<dyn std::error::Error>> {
        Ok(QueuedJob {
            job: JobId::new(job)?,
            team: team.to_owned(),
            priority: Priority::Normal,
            preemptible: false,
            needs: Requirements {
                memory_mb,
                devices: Vec::new(),
                stages: 0,
            },
            model_hash: ModelHash::new("ab".repeat(32))?,
            created_ms: 1,
            pending: 5,
            running: 0,
            checks,
        })
    }

    fn schedule(jobs: Vec<QueuedJob>) -> Schedule {
        scheduling::build(1, jobs, &Default::default(), &HashMap::new())
    }

    #[test]
    fn a_slot_picks_only_what_this_worker_can_run_until_it_runs_dry() -> Res {
        let sched = Scheduler::new(1_000, "cpu".to_owned());
        assert_eq!(
            sched.pick(HashSet::new(), 0, None, None),
            None,
            "nothing queued"
        );
        sched.set(
            schedule(vec![
                queued("big", "a", 50_000, 0)?,
                queued("small", "b", 100, 0)?,
            ]),
            OWN_READ_EVERY,
        );
        // The big job needs more memory than this worker lends.
        let (job, team) = sched.pick(HashSet::new(), 0, None, None).ok_or("no pick")?;
        assert_eq!((job.as_str(), team.as_str()), ("small", "b"));
        sched.count(&job, 1);
        // Its consumer came back empty: skipped until the next schedule.
        sched.mark_empty(&job);
        assert_eq!(sched.pick(HashSet::new(), 0, None, None), None);
        sched.set(
            schedule(vec![queued("small", "b", 100, 0)?]),
            OWN_READ_EVERY,
        );
        assert!(sched.pick(HashSet::new(), 0, None, None).is_some());
        Ok(())
    }

    #[test]
    fn check_runs_are_pulled_first_until_seen_missing() -> Res {
        let sched = Scheduler::new(0, "cpu".to_owned());
        let job = JobId::new("checked")?;
        sched.set(
            schedule(vec![queued("checked", "a", 0, 2)?]),
            OWN_READ_EVERY,
        );
        assert!(sched.checks_waiting(&job));
        sched.mark_checks_seen(&job);
        assert!(!sched.checks_waiting(&job));
        // A new schedule is read afresh.
        sched.set(
            schedule(vec![queued("checked", "a", 0, 2)?]),
            OWN_READ_EVERY,
        );
        assert!(sched.checks_waiting(&job));
        sched.set(
            schedule(vec![queued("checked", "a", 0, 0)?]),
            OWN_READ_EVERY,
        );
        assert!(!sched.checks_waiting(&job));
        Ok(())
    }
}
