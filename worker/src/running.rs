//! The running table: the shards this worker's slots are running, what
//! heartbeats report of them, how to stop each (hand back, cancel), the
//! jobs cancelled, the counts of shards done and failed, and the mean
//! shard time.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use minions_schemas::messages::InFlight;
use tokio_util::sync::CancellationToken;

use crate::beats::Beats;
use crate::lock::lock;

/// A running shard: what heartbeats report, and how to stop it.
struct Running {
    info: InFlight,
    /// Fires to hand the shard back (nak without delay).
    hand_back: CancellationToken,
    /// Fires when the shard's job is cancelled (terminate).
    cancel: CancellationToken,
}

/// The tokens a running shard watches: `hand_back` fires to give it back
/// unfinished, `cancel` when its job is cancelled.
pub(crate) struct Stops {
    /// Hand the shard back (nak without delay).
    pub(crate) hand_back: CancellationToken,
    /// The job was cancelled (terminate).
    pub(crate) cancel: CancellationToken,
}

/// Shards running here, keyed by (job, shard); changed only through the
/// methods below.
pub(crate) struct RunningTable {
    running: Mutex<HashMap<(String, u32), Running>>,
    cancelled_jobs: Mutex<HashSet<String>>,
    /// Running shards told to yield to other work.
    preempted: Mutex<HashSet<(String, u32)>>,
    done: AtomicU64,
    failed: AtomicU64,
    /// Mean shard wall time so far, ms (0 before the first).
    mean_shard_ms: AtomicU64,
    beats: Arc<Beats>,
}

impl RunningTable {
    /// Nothing running yet; starts and finishes ring `beats`.
    pub(crate) fn new(beats: Arc<Beats>) -> Self {
        Self {
            running: Mutex::new(HashMap::new()),
            cancelled_jobs: Mutex::new(HashSet::new()),
            preempted: Mutex::new(HashSet::new()),
            done: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            mean_shard_ms: AtomicU64::new(0),
            beats,
        }
    }

    /// Enters a shard that starts; its cancel token has fired already when
    /// its job was cancelled. The fleet learns of it at once (a beat now).
    pub(crate) fn track(&self, info: InFlight) -> Stops {
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
        self.beats.ask_now();
        Stops { hand_back, cancel }
    }

    /// Removes a shard that ended, however it ended.
    pub(crate) fn untrack(&self, job: &str, shard: u32) {
        lock(&self.running).remove(&(job.to_owned(), shard));
        // The fleet's view shows the slot free within moments, not an
        // interval later.
        self.beats.ask_soon();
    }

    /// The running shards, ordered by (job, shard).
    pub(crate) fn in_flight(&self) -> Vec<InFlight> {
        let mut v: Vec<InFlight> = lock(&self.running)
            .values()
            .map(|r| r.info.clone())
            .collect();
        v.sort_by(|a, b| (a.job.as_str(), a.shard).cmp(&(b.job.as_str(), b.shard)));
        v
    }

    /// Hands back one running shard now (preemption); its hand-back reason
    /// says so ([`RunningTable::take_preempted`]).
    pub(crate) fn preempt_shard(&self, job: &str, shard: u32) {
        if let Some(r) = lock(&self.running).get(&(job.to_owned(), shard)) {
            lock(&self.preempted).insert((job.to_owned(), shard));
            r.hand_back.cancel();
        }
    }

    /// Whether `job`/`shard` was handed back to yield to other work (asked
    /// once: the mark is removed).
    pub(crate) fn take_preempted(&self, job: &str, shard: u32) -> bool {
        lock(&self.preempted).remove(&(job.to_owned(), shard))
    }

    /// Hands back every running shard now; returns how many.
    pub(crate) fn hand_back_all(&self) -> usize {
        let running = lock(&self.running);
        for r in running.values() {
            r.hand_back.cancel();
        }
        running.len()
    }

    /// Hands back every running shard except those expected (from the mean
    /// shard time) to finish within `within`; returns how many.
    pub(crate) fn hand_back_unless_finishing(&self, within: Duration) -> usize {
        let mean = self.mean_shard_ms();
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

    /// Whether `job` was cancelled while this worker ran.
    pub(crate) fn is_cancelled(&self, job: &str) -> bool {
        lock(&self.cancelled_jobs).contains(job)
    }

    /// Counts a shard done.
    pub(crate) fn count_done(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a shard failed.
    pub(crate) fn count_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Shards done so far.
    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Shards failed so far.
    pub(crate) fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Records a finished shard's wall time into the running mean.
    pub(crate) fn record_duration(&self, ms: u64) {
        let old = self.mean_shard_ms.load(Ordering::Relaxed);
        let new = if old == 0 { ms } else { (old * 7 + ms) / 8 };
        self.mean_shard_ms.store(new, Ordering::Relaxed);
    }

    /// The mean shard wall time so far, ms (0 before the first).
    pub(crate) fn mean_shard_ms(&self) -> u64 {
        self.mean_shard_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use minions_schemas::JobId;

    use super::*;

    fn info(
        job: &str,
        shard: u32,
        started_ms: u64,
    ) -> Result<InFlight, Box<dyn std::error::Error>> {
        Ok(InFlight {
            job: JobId::new(job)?,
            shard,
            reply: String::new(),
            started_ms,
        })
    }

    #[test]
    fn a_cancelled_job_stops_its_shards_now_and_later() -> Result<(), Box<dyn std::error::Error>> {
        let table = RunningTable::new(Arc::new(Beats::default()));
        let a = table.track(info("a", 0, 0)?);
        let b = table.track(info("b", 0, 0)?);
        assert_eq!(table.cancel_job("a"), 1);
        assert!(a.cancel.is_cancelled() && !b.cancel.is_cancelled());
        // A shard of the cancelled job that starts later is stopped at once.
        assert!(table.track(info("a", 1, 0)?).cancel.is_cancelled());
        assert!(table.is_cancelled("a") && !table.is_cancelled("b"));
        let shards: Vec<_> = table
            .in_flight()
            .iter()
            .map(|f| (f.job.to_string(), f.shard))
            .collect();
        assert_eq!(
            shards,
            [
                ("a".to_owned(), 0),
                ("a".to_owned(), 1),
                ("b".to_owned(), 0)
            ]
        );
        table.untrack("a", 0);
        assert_eq!(table.in_flight().len(), 2);
        Ok(())
    }

    #[test]
    fn preemption_marks_the_shard_once() -> Result<(), Box<dyn std::error::Error>> {
        let table = RunningTable::new(Arc::new(Beats::default()));
        let s = table.track(info("a", 3, 0)?);
        table.preempt_shard("a", 3);
        assert!(s.hand_back.is_cancelled());
        assert!(table.take_preempted("a", 3));
        assert!(!table.take_preempted("a", 3));
        // Not running: nothing to mark.
        table.preempt_shard("a", 4);
        assert!(!table.take_preempted("a", 4));
        Ok(())
    }

    #[test]
    fn shards_about_to_finish_are_not_handed_back() -> Result<(), Box<dyn std::error::Error>> {
        let table = RunningTable::new(Arc::new(Beats::default()));
        // No mean yet: every shard goes back.
        let early = table.track(info("a", 0, minions_schemas::time::now_ms())?);
        assert_eq!(table.hand_back_unless_finishing(Duration::from_secs(5)), 1);
        assert!(early.hand_back.is_cancelled());
        table.untrack("a", 0);
        // Shards take 10 s: one started 8 s ago finishes within 5 s, one
        // that just started does not.
        table.record_duration(10_000);
        assert_eq!(table.mean_shard_ms(), 10_000);
        let now = minions_schemas::time::now_ms();
        let old = table.track(info("a", 1, now - 8_000)?);
        let new = table.track(info("a", 2, now)?);
        assert_eq!(table.hand_back_unless_finishing(Duration::from_secs(5)), 1);
        assert!(!old.hand_back.is_cancelled() && new.hand_back.is_cancelled());
        assert_eq!(table.hand_back_all(), 2);
        table.count_done();
        table.count_failed();
        table.count_done();
        assert_eq!((table.done(), table.failed()), (2, 1));
        Ok(())
    }
}
