//! The worker registry: who is alive, from their heartbeats.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use minions_schemas::WorkerId;
use minions_schemas::messages::Heartbeat;

/// What changed when a heartbeat or a tick was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A worker was seen for the first time.
    Joined(WorkerId),
    /// A worker missed too many beats and is considered gone.
    Lost(WorkerId),
}

/// One worker's entry.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The last heartbeat.
    pub beat: Heartbeat,
    /// When it arrived (local clock).
    pub seen: Instant,
}

/// Workers by id. A worker that misses `missed_beats` intervals is dropped.
#[derive(Debug)]
pub struct Registry {
    workers: HashMap<WorkerId, Entry>,
    missed_beats: u32,
}

impl Registry {
    /// An empty registry that drops a worker after `missed_beats` silent intervals.
    pub fn new(missed_beats: u32) -> Self {
        Self {
            workers: HashMap::new(),
            missed_beats: missed_beats.max(1),
        }
    }

    /// Records a heartbeat received at `now`.
    pub fn beat(&mut self, beat: Heartbeat, now: Instant) -> Option<Change> {
        let id = beat.worker.clone();
        let fresh = self
            .workers
            .insert(id.clone(), Entry { beat, seen: now })
            .is_none();
        fresh.then_some(Change::Joined(id))
    }

    /// Drops workers silent for too long at `now`.
    pub fn sweep(&mut self, now: Instant) -> Vec<Change> {
        let missed = self.missed_beats;
        let mut lost = Vec::new();
        self.workers.retain(|id, e| {
            let interval = Duration::from_millis(e.beat.interval_ms.max(1));
            let alive = now.duration_since(e.seen) <= interval * missed;
            if !alive {
                lost.push(Change::Lost(id.clone()));
            }
            alive
        });
        lost
    }

    /// Workers known now.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether no worker is known.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// A worker's entry.
    pub fn get(&self, id: &WorkerId) -> Option<&Entry> {
        self.workers.get(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb(id: &str) -> Result<Heartbeat, minions_schemas::IdError> {
        Ok(Heartbeat {
            v: minions_schemas::SCHEMA_VERSION,
            worker: WorkerId::new(id)?,
            host: "h".into(),
            device: "cpu".into(),
            slots: 1,
            draining: false,
            in_flight: vec![],
            done: 0,
            failed: 0,
            interval_ms: 1000,
            started_ms: 0,
            at_ms: 0,
        })
    }

    #[test]
    fn joins_and_loses_workers() -> Result<(), minions_schemas::IdError> {
        let mut r = Registry::new(3);
        let t0 = Instant::now();
        assert_eq!(
            r.beat(hb("a")?, t0),
            Some(Change::Joined(WorkerId::new("a")?))
        );
        assert_eq!(r.beat(hb("a")?, t0), None);
        assert!(r.sweep(t0 + Duration::from_secs(3)).is_empty());
        assert_eq!(
            r.sweep(t0 + Duration::from_millis(3001)),
            vec![Change::Lost(WorkerId::new("a")?)]
        );
        assert!(r.is_empty());
        Ok(())
    }
}
