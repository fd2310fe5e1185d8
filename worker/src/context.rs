//! State shared by a worker's slots, heartbeat, control and settlement code.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_nats::jetstream;
use minions_schemas::WorkerId;
use minions_schemas::messages::InFlight;
use object_store::ObjectStore;
use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::model::ModelCache;

/// A running shard: what heartbeats report, and how to stop it.
pub(crate) struct Running {
    pub(crate) info: InFlight,
    /// Fires to hand the shard back (nak without delay).
    pub(crate) hand_back: CancellationToken,
    /// Fires when the shard's job is cancelled (terminate).
    pub(crate) cancel: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Everything a slot needs to run and settle a shard.
pub(crate) struct Ctx {
    pub(crate) client: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) cache: ModelCache,
    /// One shard computes on the device at a time.
    pub(crate) compute: Semaphore,
    /// This worker's id; replaced when it rejoins after being declared dead.
    pub(crate) worker: RwLock<WorkerId>,
    pub(crate) name: String,
    pub(crate) host: String,
    pub(crate) device: String,
    pub(crate) slots: usize,
    pub(crate) max_batch: usize,
    pub(crate) batch_tokens: usize,
    pub(crate) generation: crate::generation::GenSettings,
    pub(crate) ack_wait: Duration,
    pub(crate) max_deliver: i64,
    pub(crate) running: Mutex<HashMap<(String, u32), Running>>,
    pub(crate) cancelled_jobs: Mutex<HashSet<String>>,
    pub(crate) done: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// True while the worker may pull: neither held by an operator (drain,
    /// evict) nor by its owner. Derived from the two holds below.
    pub(crate) pulling: watch::Sender<bool>,
    /// An operator's drain or eviction.
    pub(crate) operator_hold: Mutex<bool>,
    /// Why the owner's policy holds the worker back, if it does.
    pub(crate) owner_hold: Mutex<Option<String>>,
    /// Why the fleet quarantined this machine, if it did ([`crate::quarantine`]).
    pub(crate) quarantine_hold: Mutex<Option<String>>,
    /// Mean shard wall time so far, ms (0 before the first).
    pub(crate) mean_shard_ms: AtomicU64,
    /// The chip that runs shards, for the record (empty when unknown).
    pub(crate) chip: String,
    /// The build, device and kernel path this worker's outputs record.
    pub(crate) made_by: minions_schemas::messages::Provenance,
    /// The test-only fault switch ([`crate::fault`]); `None` in real use.
    pub(crate) perturb: Option<crate::fault::Perturb>,
    /// The most memory models may use here, MB (0 = no cap).
    pub(crate) mem_budget_mb: u64,
    /// Quiet mode: the largest share of time the device may work, (0, 1].
    pub(crate) duty_cycle: f64,
    /// Wakes the heartbeat loop to beat now (a shard started: the watchdog
    /// must learn of it before this worker can die with it unreported).
    pub(crate) beat_now: Notify,
    /// Asks the heartbeat loop for a beat shortly (a shard finished: the
    /// fleet's view should show its slot free), so that the beat of the next
    /// shard's start, usually right behind, carries both.
    pub(crate) beat_soon: Notify,
    /// What is queued, and which job a free slot pulls from.
    pub(crate) sched: crate::schedule::Scheduler,
    /// Running shards told to yield to other work (their hand-back reason).
    pub(crate) preempted: Mutex<HashSet<(String, u32)>>,
    /// The energy meter: each delivery's share, the heartbeat's power.
    pub(crate) energy: Arc<crate::energy::EnergyMeter>,
}

impl Ctx {
    pub(crate) fn worker_id(&self) -> WorkerId {
        self.worker
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn set_worker_id(&self, id: WorkerId) {
        *self.worker.write().unwrap_or_else(|p| p.into_inner()) = id;
    }

    pub(crate) fn draining(&self) -> bool {
        !*self.pulling.borrow()
    }

    fn refresh_pulling(&self) {
        let held = *lock(&self.operator_hold)
            || lock(&self.owner_hold).is_some()
            || lock(&self.quarantine_hold).is_some();
        let changed = self.pulling.send_if_modified(|p| {
            let changed = *p == held;
            *p = !held;
            changed
        });
        if changed {
            // The fleet learns of a yield or a drain at once.
            self.beat_now.notify_one();
        }
    }

    /// Sets or clears an operator's hold (drain, evict / resume).
    pub(crate) fn set_operator_hold(&self, hold: bool) {
        *lock(&self.operator_hold) = hold;
        self.refresh_pulling();
    }

    /// Sets or clears the owner policy's hold, with its reason.
    pub(crate) fn set_owner_hold(&self, reason: Option<String>) {
        *lock(&self.owner_hold) = reason;
        self.refresh_pulling();
    }

    /// Sets or clears the quarantine hold, with its reason; true when it
    /// changed.
    pub(crate) fn set_quarantine_hold(&self, reason: Option<String>) -> bool {
        let changed = {
            let mut q = lock(&self.quarantine_hold);
            let changed = q.is_some() != reason.is_some();
            *q = reason;
            changed
        };
        self.refresh_pulling();
        changed
    }

    /// The owner state as heartbeats report it.
    pub(crate) fn owner_state(&self) -> String {
        match &*lock(&self.owner_hold) {
            None => "available".to_owned(),
            Some(reason) => format!("yielded: {reason}"),
        }
    }

    /// Why running shard `job`/`shard` is being handed back, for its event.
    pub(crate) fn hand_back_reason(&self, job: &str, shard: u32) -> String {
        if lock(&self.preempted).remove(&(job.to_owned(), shard)) {
            "preempted: other work was waiting".to_owned()
        } else if let Some(reason) = &*lock(&self.quarantine_hold) {
            format!("quarantined: {reason}")
        } else if let Some(reason) = &*lock(&self.owner_hold) {
            format!("owner: {reason}")
        } else if *lock(&self.operator_hold) {
            "evicted by an operator".to_owned()
        } else {
            "worker stopping".to_owned()
        }
    }

    /// Records a finished shard's wall time into the running mean.
    pub(crate) fn record_duration(&self, ms: u64) {
        let old = self.mean_shard_ms.load(Ordering::Relaxed);
        let new = if old == 0 { ms } else { (old * 7 + ms) / 8 };
        self.mean_shard_ms.store(new, Ordering::Relaxed);
    }

    /// Hands back every running shard except those expected (from the mean
    /// shard time) to finish within `within`; returns how many.
    pub(crate) fn hand_back_unless_finishing(&self, within: std::time::Duration) -> usize {
        let mean = self.mean_shard_ms.load(Ordering::Relaxed);
        let now = minions_schemas::time::now_ms();
        let running = lock(&self.running);
        let mut n = 0;
        for r in running.values() {
            let elapsed = now.saturating_sub(r.info.started_ms);
            let left = mean.saturating_sub(elapsed);
            let finishing =
                mean > 0 && left <= u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
            if !finishing {
                r.hand_back.cancel();
                n += 1;
            }
        }
        n
    }

    pub(crate) fn track(&self, info: InFlight) -> (CancellationToken, CancellationToken) {
        let hand_back = CancellationToken::new();
        let cancel = CancellationToken::new();
        if lock(&self.cancelled_jobs).contains(info.job.as_str()) {
            cancel.cancel();
        }
        let key = (info.job.to_string(), info.shard);
        lock(&self.running).insert(
            key,
            Running {
                info,
                hand_back: hand_back.clone(),
                cancel: cancel.clone(),
            },
        );
        self.beat_now.notify_one();
        (hand_back, cancel)
    }

    pub(crate) fn untrack(&self, job: &str, shard: u32) {
        lock(&self.running).remove(&(job.to_owned(), shard));
        // The fleet's view shows the slot free within moments, not an
        // interval later.
        self.beat_soon.notify_one();
    }

    pub(crate) fn in_flight(&self) -> Vec<InFlight> {
        let mut v: Vec<InFlight> = lock(&self.running)
            .values()
            .map(|r| r.info.clone())
            .collect();
        v.sort_by(|a, b| (a.job.as_str(), a.shard).cmp(&(b.job.as_str(), b.shard)));
        v
    }

    /// Hands back one running shard now (preemption).
    pub(crate) fn preempt_shard(&self, job: &str, shard: u32) {
        if let Some(r) = lock(&self.running).get(&(job.to_owned(), shard)) {
            lock(&self.preempted).insert((job.to_owned(), shard));
            r.hand_back.cancel();
        }
    }

    /// Hands back every running shard now; returns how many.
    pub(crate) fn hand_back_all(&self) -> usize {
        let running = lock(&self.running);
        for r in running.values() {
            r.hand_back.cancel();
        }
        running.len()
    }

    /// Marks `job` cancelled and stops its running shards; returns how many.
    pub(crate) fn cancel_job(&self, job: &str) -> usize {
        lock(&self.cancelled_jobs).insert(job.to_owned());
        let running = lock(&self.running);
        let mut n = 0;
        for ((j, _), r) in running.iter() {
            if j == job {
                r.cancel.cancel();
                n += 1;
            }
        }
        n
    }

    pub(crate) fn is_cancelled(&self, job: &str) -> bool {
        lock(&self.cancelled_jobs).contains(job)
    }

    pub(crate) fn count_done(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }
}
