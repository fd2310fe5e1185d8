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
    pub(crate) ack_wait: Duration,
    pub(crate) max_deliver: i64,
    pub(crate) running: Mutex<HashMap<(String, u32), Running>>,
    pub(crate) cancelled_jobs: Mutex<HashSet<String>>,
    pub(crate) done: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// True while the worker may pull; false while drained or evicted.
    pub(crate) pulling: watch::Sender<bool>,
    /// Wakes the heartbeat loop to beat now (a shard started: the watchdog
    /// must learn of it before this worker can die with it unreported).
    pub(crate) beat_now: Notify,
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
    }

    pub(crate) fn in_flight(&self) -> Vec<InFlight> {
        let mut v: Vec<InFlight> = lock(&self.running)
            .values()
            .map(|r| r.info.clone())
            .collect();
        v.sort_by(|a, b| (a.job.as_str(), a.shard).cmp(&(b.job.as_str(), b.shard)));
        v
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
