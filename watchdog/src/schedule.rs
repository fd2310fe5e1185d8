//! Publishes the schedule: what is queued, job by job and team by team,
//! with each team's recent usage and whether preemptible work should yield.
//! Workers pick from it; the watchdog explains waits with it. Also removes
//! the consumers of jobs that have had nothing queued or running for a
//! while.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use minions_schemas::messages::{Priority, Schedule};
use minions_schemas::scheduling::{self, Teams};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, encode, streams, subjects};
use tokio_util::sync::CancellationToken;

use crate::view::View;

/// How often the schedule is read and published.
pub const EVERY: Duration = Duration::from_millis(250);
/// How often team policies are read again.
const TEAMS_EVERY: Duration = Duration::from_secs(2);
/// How long a job's consumer stays after its last shard settled (a retry or
/// re-submit within it reuses it; after it, they make it again).
const IDLE_CONSUMER: Duration = Duration::from_secs(60);

/// How often shard messages without a job consumer are looked for.
const ORPHAN_SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Settings of the schedule loop.
#[derive(Debug, Clone)]
pub struct ScheduleSettings {
    /// How often to publish.
    pub every: Duration,
    /// The job consumer settings (the work stream's), for jobs whose
    /// shards were queued without one.
    pub work: streams::WorkSettings,
    /// Half-life of the team usage that discounts a team's claim.
    pub usage_half_life: Duration,
}

impl Default for ScheduleSettings {
    fn default() -> Self {
        Self {
            every: EVERY,
            work: streams::WorkSettings::default(),
            usage_half_life: Duration::from_secs(24 * 3600),
        }
    }
}

/// Folds each team's running shards into its usage over `dt`.
fn fold_usage(
    usage: &mut HashMap<String, f64>,
    schedule: &Schedule,
    dt: Duration,
    half_life: Duration,
) {
    let mut running: HashMap<&str, f64> = HashMap::new();
    for j in &schedule.jobs {
        *running.entry(&j.team).or_default() += j.running as f64;
    }
    for t in &schedule.teams {
        let r = running.get(t.team.as_str()).copied().unwrap_or(0.0);
        let u = usage.entry(t.team.clone()).or_default();
        *u = scheduling::decay_usage(*u, r, dt.as_secs_f64(), half_life.as_secs_f64());
    }
    for (team, u) in usage.iter_mut() {
        if !running.contains_key(team.as_str()) && !schedule.teams.iter().any(|t| &t.team == team) {
            *u = scheduling::decay_usage(*u, 0.0, dt.as_secs_f64(), half_life.as_secs_f64());
        }
    }
    usage.retain(|_, u| *u > 1e-6);
}

/// The fraction of preemptible shards that should yield: non-preemptible
/// work has been queued for two readings in a row (so idle slots had their
/// chance), as many as it needs.
fn preempt_fraction(schedule: &Schedule, waited_before: bool) -> f64 {
    let regular: u64 = schedule
        .jobs
        .iter()
        .filter(|j| !j.preemptible)
        .map(|j| j.pending)
        .sum();
    let preemptible: u64 = schedule
        .jobs
        .iter()
        .filter(|j| j.preemptible)
        .map(|j| j.running)
        .sum();
    if regular == 0 || preemptible == 0 || !waited_before {
        return 0.0;
    }
    (regular as f64 / preemptible as f64).min(1.0)
}

/// Reads and publishes the schedule every `settings.every` until `stop`.
pub async fn run(
    js: jetstream::Context,
    client: async_nats::Client,
    store: Arc<dyn object_store::ObjectStore>,
    view: Arc<View>,
    settings: ScheduleSettings,
    stop: CancellationToken,
) {
    let mut orphans = crate::orphans::OrphanSweep::new();
    let mut last_sweep = Instant::now();
    let mut tick = tokio::time::interval(settings.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut usage: HashMap<String, f64> = HashMap::new();
    let mut teams = Teams::default();
    let mut teams_read: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut regular_waited = false;
    let mut idle_since: HashMap<JobId, Instant> = HashMap::new();
    // A slow list while a consumer's leader is elected: the last stands.
    let mut listed = minions_endpoints::queue::Standing::default();
    // A submit's nudge: the schedule is rebuilt at once, so a new job
    // starts without waiting for the tick.
    let mut queued = minions_endpoints::queue::Nudges::follow(&client).await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
            () = queued.next() => {
                tick.reset();
            }
        }
        use minions_endpoints::queue::Reading;
        let (jobs, fresh) = match listed.read(minions_endpoints::queue::list_jobs(&js)).await {
            Reading::Fresh(j) => (j, true),
            Reading::Stands(j) => {
                tracing::debug!("consumer list slow (a leader election?); the last one stands");
                (j, false)
            }
            Reading::Failed(e) => {
                tracing::debug!(error = %e, "schedule not read");
                continue;
            }
        };
        if teams_read.is_none_or(|t| t.elapsed() >= TEAMS_EVERY) {
            match minions_endpoints::queue::read_teams(&js).await {
                Ok((t, _)) => teams = t,
                Err(e) => {
                    tracing::warn!(error = %e, "team policies not read; keeping the last ones")
                }
            }
            teams_read = Some(Instant::now());
        }
        // Consumers are removed on what a list read now says only.
        if fresh {
            forget_idle(&js, &jobs, &mut idle_since).await;
        }
        if fresh && last_sweep.elapsed() >= ORPHAN_SWEEP_EVERY {
            last_sweep = Instant::now();
            orphans.sweep(&js, &store, &settings.work, &jobs).await;
        }
        let now = Instant::now();
        let mut schedule = scheduling::build(now_ms(), jobs, &teams, &usage);
        if let Some(prev) = last {
            fold_usage(&mut usage, &schedule, now - prev, settings.usage_half_life);
            for t in &mut schedule.teams {
                t.usage = usage.get(&t.team).copied().unwrap_or(0.0);
            }
        }
        last = Some(now);
        schedule.preempt = preempt_fraction(&schedule, regular_waited);
        schedule.idle = view
            .workers(Instant::now())
            .iter()
            .filter(|w| {
                w.alive()
                    && w.lending()
                    && w.state != minions_schemas::messages::WorkerState::Draining
            })
            .map(|w| u64::from(w.slots).saturating_sub(w.running.len() as u64))
            .sum();
        regular_waited = schedule
            .jobs
            .iter()
            .any(|j| !j.preemptible && j.pending > 0);
        match encode("schedule", &schedule) {
            Ok(bytes) => {
                if let Err(e) = client.publish(subjects::SCHEDULE, bytes.into()).await {
                    tracing::debug!(error = %e, "schedule not published");
                }
            }
            Err(e) => tracing::warn!(error = %e, "schedule not encoded"),
        }
        view.set_schedule(schedule);
    }
}

/// Whether a consumer deletion failed because there was none.
fn is_not_found(e: &jetstream::stream::ConsumerError) -> bool {
    e.to_string().contains("not found")
}

/// Removes the consumers of jobs with nothing queued or running for
/// [`IDLE_CONSUMER`].
async fn forget_idle(
    js: &jetstream::Context,
    jobs: &[minions_schemas::messages::QueuedJob],
    idle_since: &mut HashMap<JobId, Instant>,
) {
    let now = Instant::now();
    idle_since.retain(|j, _| jobs.iter().any(|q| &q.job == j));
    for q in jobs {
        if q.pending > 0 || q.running > 0 {
            idle_since.remove(&q.job);
            continue;
        }
        let since = *idle_since.entry(q.job.clone()).or_insert(now);
        if now - since < IDLE_CONSUMER {
            continue;
        }
        let Ok(stream) = js.get_stream(streams::WORK_STREAM).await else {
            return;
        };
        // The check consumer first: while the job's own remains, the job
        // stays listed and this is tried again.
        if let Err(e) = stream
            .delete_consumer(&scheduling::check_consumer(&q.job))
            .await
            && !is_not_found(&e)
        {
            tracing::debug!(job = %q.job, error = %e, "check consumer not removed");
            continue;
        }
        match stream
            .delete_consumer(&scheduling::job_consumer(&q.job))
            .await
        {
            Ok(_) => {
                tracing::info!(job = %q.job, "job has nothing queued; its consumer removed");
                idle_since.remove(&q.job);
            }
            Err(e) => tracing::debug!(job = %q.job, error = %e, "job consumer not removed"),
        }
    }
}

/// A short account of why `job` waits, from the schedule (`None` when it
/// is not queued or nothing holds it back that the schedule shows).
pub fn why_waiting(schedule: &Schedule, job: &JobId, workers: &[(u64, String)]) -> Option<String> {
    let q = schedule.jobs.iter().find(|j| &j.job == job)?;
    if q.pending == 0 {
        return None;
    }
    if !workers.is_empty() && !q.needs.met_by_any(workers) {
        let devices = if q.needs.devices.is_empty() {
            String::new()
        } else {
            format!(" on {}", q.needs.devices.join(" or "))
        };
        return Some(format!(
            "no live worker lends {} MB{devices} (the job needs it; `minions submit --memory-mb` sets it)",
            q.needs.memory_mb
        ));
    }
    let team = schedule.teams.iter().find(|t| t.team == q.team);
    let team_running: u64 = schedule
        .jobs
        .iter()
        .filter(|j| j.team == q.team)
        .map(|j| j.running)
        .sum();
    if let Some(t) = team
        && t.quota > 0
        && team_running >= u64::from(t.quota)
    {
        return Some(format!(
            "team {} is at its quota ({} of {} slots)",
            q.team, team_running, t.quota
        ));
    }
    let ahead: Vec<String> = schedule
        .jobs
        .iter()
        .filter(|j| {
            j.team == q.team
                && j.job != q.job
                && j.pending > 0
                && !j.preemptible
                && (j.priority > q.priority
                    || (j.priority == q.priority && j.created_ms < q.created_ms))
        })
        .map(|j| j.job.to_string())
        .collect();
    if q.preemptible
        && schedule
            .jobs
            .iter()
            .any(|j| !j.preemptible && j.pending > 0)
    {
        return Some("it is preemptible and other jobs are queued".to_owned());
    }
    // Fair share: running per unit of claim, this team against the others
    // with work queued.
    let load = |team: &str| {
        let running: u64 = schedule
            .jobs
            .iter()
            .filter(|j| j.team == team && !j.preemptible)
            .map(|j| j.running)
            .sum();
        let claim = schedule
            .teams
            .iter()
            .find(|t| t.team == team)
            .map_or(1.0, |t| t.claim());
        running as f64 / claim
    };
    let mine = load(&q.team);
    let others_waiting = schedule
        .jobs
        .iter()
        .filter(|j| j.team != q.team && j.pending > 0 && !j.preemptible)
        .any(|j| load(&j.team) < mine);
    if others_waiting {
        return Some(format!(
            "team {} is over its share ({} running; teams below theirs go first)",
            q.team, team_running
        ));
    }
    if !ahead.is_empty() {
        let n = ahead.len();
        let first = &ahead[0];
        let prio = if q.priority == Priority::High {
            "priority"
        } else {
            "higher priority or age"
        };
        return Some(format!(
            "{n} job(s) of team {} go first by {prio} (first: {first})",
            q.team
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::ModelHash;
    use minions_schemas::messages::{QueuedJob, Requirements};

    fn id(s: &str) -> JobId {
        JobId::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn job(id: &str, team: &str, pending: u64, running: u64, preemptible: bool) -> QueuedJob {
        QueuedJob {
            job: self::id(id),
            team: team.into(),
            priority: Priority::Normal,
            preemptible,
            needs: Requirements {
                memory_mb: 16_000,
                devices: vec![],
                stages: 0,
            },
            model_hash: ModelHash::new("b".repeat(64)).unwrap_or_else(|e| panic!("{e}")),
            created_ms: 1,
            pending,
            running,
            checks: 0,
        }
    }

    #[test]
    fn preemption_waits_one_reading_and_asks_for_what_is_needed() {
        let s = scheduling::build(
            0,
            vec![job("r", "a", 2, 0, false), job("p", "b", 10, 8, true)],
            &Teams::default(),
            &HashMap::new(),
        );
        assert_eq!(preempt_fraction(&s, false), 0.0);
        assert!((preempt_fraction(&s, true) - 0.25).abs() < 1e-9);
    }

    #[test]
    fn waits_are_explained() {
        let s = scheduling::build(
            0,
            vec![job("big", "a", 5, 0, false)],
            &Teams::default(),
            &HashMap::new(),
        );
        let why = why_waiting(&s, &id("big"), &[(8000, "cpu".into())]);
        assert!(
            why.unwrap_or_default()
                .contains("no live worker lends 16000 MB")
        );
        let s = scheduling::build(
            0,
            vec![job("a1", "a", 5, 3, false), job("b1", "b", 5, 1, false)],
            &Teams::default(),
            &HashMap::new(),
        );
        let why = why_waiting(&s, &id("a1"), &[(32_000, "cpu".into())]);
        assert!(why.unwrap_or_default().contains("team a is over its share"));
    }

    #[test]
    fn usage_follows_running_slots() {
        let s = scheduling::build(
            0,
            vec![job("a1", "a", 5, 4, false)],
            &Teams::default(),
            &HashMap::new(),
        );
        let mut usage = HashMap::new();
        let hl = Duration::from_secs(10);
        fold_usage(&mut usage, &s, hl, hl);
        assert!((usage["a"] - 2.0).abs() < 1e-9);
    }
}
