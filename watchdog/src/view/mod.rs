//! What the watchdog knows, shared between its loop (which writes it) and
//! its web pages and `/metrics` (which read snapshots of it): the worker
//! registry, every job's progress with the fleet's counters, and the work
//! queue. Locks are held only to copy or update, never across an await.

pub mod counters;
pub mod job_progress;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use minions_schemas::messages::{OperatorAction, WorkerState};
use minions_schemas::progress::Progress;
use serde::Serialize;

use crate::queue::QueueInfo;
use crate::registry::Registry;
use counters::Counters;
use job_progress::JobsView;

/// How many ended jobs the dashboard and metrics keep showing.
pub const ENDED_JOBS_SHOWN: usize = 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The shared view.
#[derive(Debug)]
pub struct View {
    /// This watchdog's name.
    pub name: String,
    /// When it started (ms since the epoch).
    pub started_ms: u64,
    registry: Mutex<Registry>,
    jobs: Mutex<JobsView>,
    queue: Mutex<QueueInfo>,
    schedule: Mutex<Option<std::sync::Arc<minions_schemas::messages::Schedule>>>,
    heartbeats: AtomicU64,
    /// Canaries judged by this watchdog: passed, failed.
    canaries: [AtomicU64; 2],
    quarantined: Mutex<BTreeMap<String, String>>,
    /// The last operator actions on record, oldest first.
    actions: Mutex<std::collections::VecDeque<OperatorAction>>,
    /// Why jobs split by layers wait for their group, by job.
    group_waits: Mutex<std::collections::HashMap<minions_schemas::JobId, String>>,
    /// Jobs running on a group the former formed.
    on_groups: Mutex<std::collections::HashSet<minions_schemas::JobId>>,
}

/// One worker as the dashboard shows it.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerRow {
    /// Worker id.
    pub id: String,
    /// Host name.
    pub host: String,
    /// Compute device.
    pub device: String,
    /// The worker's build (empty for workers of older releases).
    pub build: String,
    /// The kernel path it runs (empty for workers of older releases).
    pub kernel: String,
    /// Registry state.
    pub state: WorkerState,
    /// `available`, or why the owner holds the machine.
    pub owner: String,
    /// Concurrent shard slots.
    pub slots: u32,
    /// The most shards it holds at once (its slots, and the shards that
    /// join its running generation batch).
    pub holds: u32,
    /// Shards running now, as `job/shard`.
    pub running: Vec<String>,
    /// Shards done since the worker started.
    pub done: u64,
    /// Deliveries failed since the worker started.
    pub failed: u64,
    /// Records per second over the last minute.
    pub rate: f64,
    /// Machine memory, MB (0 = unknown).
    pub mem_total_mb: u64,
    /// Available memory, MB (0 = unknown).
    pub mem_avail_mb: u64,
    /// Memory the owner lends to models, MB (0 = no cap).
    pub mem_budget_mb: u64,
    /// The stage of a group it holds, in words (empty: none).
    pub stage: String,
    /// Seconds since its last heartbeat.
    pub last_beat_secs: f64,
}

impl WorkerRow {
    /// Alive: not dead, gone or silent.
    pub fn alive(&self) -> bool {
        !self.state.is_final() && self.state != WorkerState::Suspect
    }

    /// Whether its owner lets it work.
    pub fn lending(&self) -> bool {
        self.owner == "available"
    }
}

/// Everything the pages and metrics show, copied at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// The watchdog's name.
    pub watchdog: String,
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// Workers, by host then id.
    pub workers: Vec<WorkerRow>,
    /// Workers per state.
    pub states: BTreeMap<&'static str, usize>,
    /// Live workers whose owner holds the machine.
    pub owner_active: usize,
    /// Jobs not ended, then the last few ended ones; newest id first.
    pub jobs: Vec<Progress>,
    /// The work queue.
    pub queue: QueueInfo,
    /// Fleet counters.
    pub counters: Counters,
    /// Records done per minute over the last hour, oldest first.
    pub history: Vec<u64>,
    /// Heartbeats received.
    pub heartbeats: u64,
    /// Canaries this watchdog judged since it started: passed, failed.
    pub canaries: [u64; 2],
    /// Teams with work or a policy, from the last schedule.
    pub teams: Vec<TeamRow>,
    /// Quarantined machines and why (their workers pull nothing).
    pub quarantined: BTreeMap<String, String>,
    /// The last operator actions on record, newest first.
    pub actions: Vec<OperatorAction>,
}

impl View {
    /// A view around `registry`.
    pub fn new(name: String, registry: Registry) -> Self {
        Self {
            name,
            started_ms: minions_schemas::time::now_ms(),
            registry: Mutex::new(registry),
            jobs: Mutex::new(JobsView::default()),
            queue: Mutex::new(QueueInfo::default()),
            schedule: Mutex::new(None),
            heartbeats: AtomicU64::new(0),
            canaries: [AtomicU64::new(0), AtomicU64::new(0)],
            quarantined: Mutex::new(BTreeMap::new()),
            actions: Mutex::new(std::collections::VecDeque::new()),
            group_waits: Mutex::new(std::collections::HashMap::new()),
            on_groups: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Records why `job` waits for its group (`None`: it has one).
    pub fn set_group_wait(&self, job: &minions_schemas::JobId, why: Option<String>) {
        let mut w = lock(&self.group_waits);
        match why {
            Some(why) => {
                w.insert(job.clone(), why);
            }
            None => {
                w.remove(job);
            }
        }
    }

    /// Records whether `job` runs on a group (formed, not yet released).
    pub fn set_on_group(&self, job: &minions_schemas::JobId, on: bool) {
        let mut g = lock(&self.on_groups);
        if on {
            g.insert(job.clone());
        } else {
            g.remove(job);
        }
    }

    /// Whether `job` runs on a group.
    pub fn on_group(&self, job: &minions_schemas::JobId) -> bool {
        lock(&self.on_groups).contains(job)
    }

    /// Why `job` waits for its group, if it does.
    pub fn group_wait(&self, job: &minions_schemas::JobId) -> Option<String> {
        lock(&self.group_waits).get(job).cloned()
    }

    /// The registry, locked (do not hold across an await).
    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        lock(&self.registry)
    }

    /// The jobs, locked (do not hold across an await).
    pub fn jobs(&self) -> MutexGuard<'_, JobsView> {
        lock(&self.jobs)
    }

    /// Replaces the queue reading.
    pub fn set_queue(&self, q: QueueInfo) {
        *lock(&self.queue) = q;
    }

    /// The last queue reading.
    pub fn queue(&self) -> QueueInfo {
        lock(&self.queue).clone()
    }

    /// Replaces the schedule last published.
    pub fn set_schedule(&self, s: minions_schemas::messages::Schedule) {
        *lock(&self.schedule) = Some(std::sync::Arc::new(s));
    }

    /// The schedule last published, if any.
    pub fn schedule(&self) -> Option<std::sync::Arc<minions_schemas::messages::Schedule>> {
        lock(&self.schedule).clone()
    }

    /// Adds actions read from the record (oldest first), keeping the last
    /// [`crate::recent_actions::RECENT`].
    pub fn push_actions(&self, new: impl IntoIterator<Item = OperatorAction>) {
        let mut kept = lock(&self.actions);
        kept.extend(new);
        while kept.len() > crate::recent_actions::RECENT {
            kept.pop_front();
        }
    }

    /// Replaces the quarantined machines (machine → reason).
    pub fn set_quarantined(&self, q: BTreeMap<String, String>) {
        *lock(&self.quarantined) = q;
    }

    /// Whether the quarantine bucket, as last read, holds `machine`
    /// quarantined.
    pub fn is_quarantined(&self, machine: &str) -> bool {
        lock(&self.quarantined).contains_key(machine)
    }

    /// Counts a canary judged.
    pub fn count_canary(&self, passed: bool) {
        self.canaries[usize::from(!passed)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a heartbeat received.
    pub fn count_heartbeat(&self) {
        self.heartbeats.fetch_add(1, Ordering::Relaxed);
    }

    /// The workers as rows, by host then id.
    pub fn workers(&self, now: Instant) -> Vec<WorkerRow> {
        let now_ms = minions_schemas::time::now_ms();
        let mut rows: Vec<(minions_schemas::WorkerId, WorkerRow)> = {
            let reg = self.registry();
            reg.iter()
                .map(|(id, t)| {
                    let b = &t.beat;
                    let row = WorkerRow {
                        id: id.to_string(),
                        host: b.host.clone(),
                        device: b.device.clone(),
                        build: b.build.clone(),
                        kernel: b.kernel.clone(),
                        state: t.state,
                        owner: b.owner.clone(),
                        slots: b.slots,
                        holds: b.holds_at_most(),
                        running: b
                            .in_flight
                            .iter()
                            .map(|f| format!("{}/{}", f.job, f.shard))
                            .collect(),
                        done: b.done,
                        failed: b.failed,
                        rate: 0.0,
                        mem_total_mb: b.mem_total_mb,
                        mem_avail_mb: b.mem_avail_mb,
                        mem_budget_mb: b.mem_budget_mb,
                        stage: b.stage.as_ref().map(|s| s.describe()).unwrap_or_default(),
                        last_beat_secs: now.saturating_duration_since(t.seen).as_secs_f64(),
                    };
                    (id.clone(), row)
                })
                .collect()
        };
        {
            let jobs = self.jobs();
            for (id, r) in &mut rows {
                r.rate = jobs.worker_rate(id, now_ms);
            }
        }
        let mut rows: Vec<WorkerRow> = rows.into_iter().map(|(_, r)| r).collect();
        rows.sort_by(|a, b| (&a.host, &a.id).cmp(&(&b.host, &b.id)));
        rows
    }

    /// Copies everything the pages show.
    pub fn snapshot(&self) -> Snapshot {
        let now_ms = minions_schemas::time::now_ms();
        let workers = self.workers(Instant::now());
        let mut states: BTreeMap<&'static str, usize> = BTreeMap::new();
        for s in [
            WorkerState::Joining,
            WorkerState::Idle,
            WorkerState::Busy,
            WorkerState::Draining,
            WorkerState::Suspect,
            WorkerState::Dead,
            WorkerState::Left,
        ] {
            states.insert(s.as_str(), 0);
        }
        for w in &workers {
            *states.entry(w.state.as_str()).or_default() += 1;
        }
        let owner_active = workers.iter().filter(|w| w.alive() && !w.lending()).count();
        let (jobs, counters, history) = {
            let view = self.jobs();
            let all: Vec<Progress> = view.iter().map(|j| j.progress(now_ms)).collect();
            let (mut active, ended): (Vec<_>, Vec<_>) =
                all.into_iter().partition(|p| !p.state.is_final());
            let mut ended: Vec<Progress> = ended;
            ended.sort_by_key(|p| std::cmp::Reverse(p.created_ms));
            ended.truncate(ENDED_JOBS_SHOWN);
            active.sort_by_key(|p| std::cmp::Reverse(p.created_ms));
            active.extend(ended);
            (active, view.counters.clone(), view.history(now_ms))
        };
        Snapshot {
            watchdog: self.name.clone(),
            at_ms: now_ms,
            workers,
            states,
            owner_active,
            jobs,
            queue: self.queue(),
            counters,
            history,
            heartbeats: self.heartbeats.load(Ordering::Relaxed),
            canaries: [
                self.canaries[0].load(Ordering::Relaxed),
                self.canaries[1].load(Ordering::Relaxed),
            ],
            teams: self.teams(),
            quarantined: lock(&self.quarantined).clone(),
            actions: lock(&self.actions).iter().rev().cloned().collect(),
        }
    }

    /// Each team in the last schedule: queued and running shards, usage.
    pub fn teams(&self) -> Vec<TeamRow> {
        let Some(s) = self.schedule() else {
            return Vec::new();
        };
        s.teams
            .iter()
            .map(|t| {
                let jobs = s.jobs.iter().filter(|j| j.team == t.team);
                let (mut pending, mut running) = (0, 0);
                for j in jobs {
                    pending += j.pending;
                    running += j.running;
                }
                TeamRow {
                    team: t.team.clone(),
                    weight: t.weight,
                    quota: t.quota,
                    usage: t.usage,
                    pending,
                    running,
                }
            })
            .collect()
    }
}

/// One team as the dashboard and metrics show it.
#[derive(Debug, Clone, Serialize)]
pub struct TeamRow {
    /// The team.
    pub team: String,
    /// Its weight.
    pub weight: f64,
    /// Its slot cap (0 = none).
    pub quota: u32,
    /// Its recent usage (slots, averaged over the usage half-life).
    pub usage: f64,
    /// Shards queued.
    pub pending: u64,
    /// Shards running (delivered, not yet acknowledged).
    pub running: u64,
}
