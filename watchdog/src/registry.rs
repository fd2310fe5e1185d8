//! The watchdog's live view of the fleet, from heartbeats: each worker's
//! state and the transitions between states. Pure logic, no I/O: the caller
//! decides what a transition does (write the registry, hand shards back).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use minions_schemas::WorkerId;
use minions_schemas::messages::{Heartbeat, WorkerState};

/// A state change of one worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The worker.
    pub worker: WorkerId,
    /// Its state before (None: first seen).
    pub from: Option<WorkerState>,
    /// Its state now.
    pub to: WorkerState,
    /// Why, in words.
    pub reason: String,
}

/// What a heartbeat told the registry.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// Nothing changed.
    Same,
    /// The worker changed state.
    Changed(Transition),
    /// A worker already declared dead is beating again: it must rejoin under
    /// a new id, and its beats are not trusted meanwhile.
    Fenced(WorkerId),
}

/// One worker as the watchdog sees it.
#[derive(Debug, Clone)]
pub struct Tracked {
    /// Its last heartbeat.
    pub beat: Heartbeat,
    /// When that beat arrived (local clock).
    pub seen: Instant,
    /// Its state.
    pub state: WorkerState,
}

/// Workers by id.
#[derive(Debug)]
pub struct Registry {
    workers: HashMap<WorkerId, Tracked>,
    missed_beats: u32,
    /// How long dead and departed workers are remembered (for fencing).
    forget_after: Duration,
}

impl Registry {
    /// An empty registry that declares a worker dead after `missed_beats`
    /// silent heartbeat intervals (suspect after half of that).
    pub fn new(missed_beats: u32) -> Self {
        Self {
            workers: HashMap::new(),
            missed_beats: missed_beats.max(1),
            forget_after: Duration::from_secs(600),
        }
    }

    /// Records a heartbeat received at `now`.
    pub fn beat(&mut self, beat: Heartbeat, now: Instant) -> Observation {
        let id = beat.worker.clone();
        let to = beat.state();
        match self.workers.get_mut(&id) {
            Some(t) if t.state == WorkerState::Dead => Observation::Fenced(id),
            Some(t) => {
                let from = t.state;
                t.beat = beat;
                t.seen = now;
                let to = if from == WorkerState::Joining && to == WorkerState::Left {
                    WorkerState::Left
                } else {
                    to
                };
                if from == to || from == WorkerState::Left {
                    return Observation::Same;
                }
                t.state = to;
                let reason = match (from, to) {
                    (WorkerState::Suspect, _) => "heartbeats resumed".to_owned(),
                    (_, WorkerState::Draining) => "draining".to_owned(),
                    (_, WorkerState::Left) => "stopped cleanly".to_owned(),
                    (_, WorkerState::Busy) => format!("running {} shards", t.beat.in_flight.len()),
                    _ => "idle".to_owned(),
                };
                Observation::Changed(Transition {
                    worker: id,
                    from: Some(from),
                    to,
                    reason,
                })
            }
            None => {
                let state = if to == WorkerState::Left {
                    to
                } else {
                    WorkerState::Joining
                };
                self.workers.insert(
                    id.clone(),
                    Tracked {
                        beat,
                        seen: now,
                        state,
                    },
                );
                Observation::Changed(Transition {
                    worker: id,
                    from: None,
                    to: state,
                    reason: "first heartbeat".to_owned(),
                })
            }
        }
    }

    /// Marks a worker dead without waiting (an eviction by a person, or a
    /// registry record that says so); returns its last beat.
    pub fn mark_dead(&mut self, id: &WorkerId) -> Option<Heartbeat> {
        let t = self.workers.get_mut(id)?;
        t.state = WorkerState::Dead;
        Some(t.beat.clone())
    }

    /// Finds workers that went silent at `now`: suspect after half the
    /// allowed missed beats, dead after all of them. Forgets long-gone ones.
    pub fn sweep(&mut self, now: Instant) -> Vec<Transition> {
        let missed = self.missed_beats;
        let forget_after = self.forget_after;
        let mut out = Vec::new();
        self.workers.retain(|id, t| {
            let silent = now.saturating_duration_since(t.seen);
            if t.state.is_final() {
                return silent < forget_after;
            }
            let interval = Duration::from_millis(t.beat.interval_ms.max(1));
            let dead_after = interval * missed;
            let suspect_after = dead_after / 2;
            let to = if silent > dead_after {
                WorkerState::Dead
            } else if silent > suspect_after && t.state != WorkerState::Suspect {
                WorkerState::Suspect
            } else {
                return true;
            };
            out.push(Transition {
                worker: id.clone(),
                from: Some(t.state),
                to,
                reason: format!("no heartbeat for {} ms", silent.as_millis()),
            });
            t.state = to;
            true
        });
        out
    }

    /// Every worker's entry.
    pub fn iter(&self) -> impl Iterator<Item = (&WorkerId, &Tracked)> {
        self.workers.iter()
    }

    /// A worker's entry.
    pub fn get(&self, id: &WorkerId) -> Option<&Tracked> {
        self.workers.get(id)
    }

    /// Workers not dead or gone.
    pub fn alive(&self) -> usize {
        self.workers
            .values()
            .filter(|t| !t.state.is_final())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::messages::InFlight;

    fn hb(id: &str, busy: bool) -> Result<Heartbeat, minions_schemas::IdError> {
        Ok(Heartbeat {
            power: None,
            chip: String::new(),
            lend_mb: 0,
            build: String::new(),
            kernel: String::new(),
            stage: None,
            v: minions_schemas::SCHEMA_VERSION,
            worker: WorkerId::new(id)?,
            host: "h".into(),
            device: "cpu".into(),
            slots: 1,
            holds: 0,
            draining: false,
            leaving: false,
            owner: "available".into(),
            mem_total_mb: 0,
            mem_avail_mb: 0,
            mem_budget_mb: 0,
            in_flight: if busy {
                vec![InFlight {
                    job: minions_schemas::JobId::new("j")?,
                    shard: 1,
                    reply: "r".into(),
                    started_ms: 0,
                }]
            } else {
                vec![]
            },
            done: 0,
            failed: 0,
            interval_ms: 1000,
            started_ms: 0,
            at_ms: 0,
        })
    }

    fn to(o: &Observation) -> Option<WorkerState> {
        match o {
            Observation::Changed(t) => Some(t.to),
            _ => None,
        }
    }

    #[test]
    fn lifecycle_and_fencing() -> Result<(), minions_schemas::IdError> {
        let mut r = Registry::new(3);
        let t0 = Instant::now();
        assert_eq!(to(&r.beat(hb("a", false)?, t0)), Some(WorkerState::Joining));
        assert_eq!(to(&r.beat(hb("a", true)?, t0)), Some(WorkerState::Busy));
        assert_eq!(r.beat(hb("a", true)?, t0), Observation::Same);
        assert!(r.sweep(t0 + Duration::from_millis(1500)).is_empty());
        let s = r.sweep(t0 + Duration::from_millis(1501));
        assert_eq!(s.first().map(|t| t.to), Some(WorkerState::Suspect));
        assert!(
            r.sweep(t0 + Duration::from_millis(2000)).is_empty(),
            "suspect is reported once"
        );
        let d = r.sweep(t0 + Duration::from_millis(3001));
        assert_eq!(d.first().map(|t| t.to), Some(WorkerState::Dead));
        assert!(
            r.sweep(t0 + Duration::from_secs(5)).is_empty(),
            "dead is reported once"
        );
        assert_eq!(
            r.beat(hb("a", true)?, t0 + Duration::from_secs(6)),
            Observation::Fenced(WorkerId::new("a")?)
        );
        assert_eq!(r.alive(), 0);
        Ok(())
    }

    #[test]
    fn suspect_recovers_and_leaving_is_final() -> Result<(), minions_schemas::IdError> {
        let mut r = Registry::new(3);
        let t0 = Instant::now();
        r.beat(hb("a", false)?, t0);
        r.beat(hb("a", false)?, t0);
        r.sweep(t0 + Duration::from_millis(1600));
        let back = r.beat(hb("a", false)?, t0 + Duration::from_millis(1700));
        assert_eq!(to(&back), Some(WorkerState::Idle));
        let mut bye = hb("a", false)?;
        bye.leaving = true;
        assert_eq!(
            to(&r.beat(bye, t0 + Duration::from_secs(2))),
            Some(WorkerState::Left)
        );
        assert!(
            r.sweep(t0 + Duration::from_secs(60)).is_empty(),
            "a worker that left is never declared dead"
        );
        Ok(())
    }
}
