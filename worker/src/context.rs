//! State shared by a worker's slots, heartbeat and settlement code.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use minions_schemas::WorkerId;
use minions_schemas::messages::InFlight;
use object_store::ObjectStore;
use std::sync::Arc;
use tokio::sync::Semaphore;

use crate::model::ModelCache;

/// Everything a slot needs to run and settle a shard.
pub(crate) struct Ctx {
    pub(crate) client: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) cache: ModelCache,
    /// One shard computes on the device at a time.
    pub(crate) compute: Semaphore,
    pub(crate) worker: WorkerId,
    pub(crate) host: String,
    pub(crate) device: String,
    pub(crate) slots: usize,
    pub(crate) max_batch: usize,
    pub(crate) ack_wait: Duration,
    pub(crate) max_deliver: i64,
    pub(crate) in_flight: Mutex<HashMap<(String, u32), InFlight>>,
    pub(crate) done: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) draining: AtomicBool,
}

impl Ctx {
    pub(crate) fn track(&self, entry: InFlight) {
        let mut m = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        m.insert((entry.job.to_string(), entry.shard), entry);
    }

    pub(crate) fn untrack(&self, job: &str, shard: u32) {
        let mut m = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(&(job.to_owned(), shard));
    }

    pub(crate) fn in_flight(&self) -> Vec<InFlight> {
        let m = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<InFlight> = m.values().cloned().collect();
        v.sort_by(|a, b| (a.job.as_str(), a.shard).cmp(&(b.job.as_str(), b.shard)));
        v
    }

    pub(crate) fn count_done(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }
}
