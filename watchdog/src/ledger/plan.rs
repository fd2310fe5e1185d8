//! Folding a run of events into what the ledger must write: one row change
//! per delivery, the shards that finished, each job's first start, and the
//! workers seen. Pure: no database here, so the rules are unit-tested.

use std::collections::BTreeMap;

use minions_schemas::messages::{Energy, EventKind, ShardEvent};

/// Identifies one delivery of a shard to a worker.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct AttemptKey {
    pub(crate) job: String,
    pub(crate) shard: u32,
    pub(crate) attempt: u64,
    pub(crate) worker: String,
}

/// What the events of one batch say about one delivery.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct AttemptRow {
    pub(crate) host: String,
    pub(crate) started_ms: Option<u64>,
    pub(crate) ended_ms: Option<u64>,
    /// Device time as the worker reported it (done); failed and handed-back
    /// deliveries take theirs from the start the ledger already holds.
    pub(crate) busy_ms: Option<u64>,
    pub(crate) compute_ms: Option<u64>,
    /// `None` while only its start is known (`running` in the table).
    pub(crate) outcome: Option<&'static str>,
    pub(crate) reason: Option<String>,
    pub(crate) records: u64,
    pub(crate) tokens: u64,
    /// Milliseconds of audio (speech shards).
    pub(crate) audio_ms: u64,
    pub(crate) energy: Option<Energy>,
}

impl AttemptRow {
    /// Records a run that ended with an output (`done`, a duplicate, or a
    /// check run) as its event reports it.
    fn ran(
        &mut self,
        e: &ShardEvent,
        busy_ms: u64,
        compute_ms: u64,
        outcome: &'static str,
        records: u64,
    ) {
        self.ended_ms = Some(e.at_ms);
        self.busy_ms = Some(busy_ms);
        self.compute_ms = Some(compute_ms);
        self.outcome = Some(outcome);
        self.records = records;
        self.energy = e.energy.clone();
    }

    /// Whether the delivery ended in this batch (its usage is counted now).
    pub(crate) fn ended(&self) -> bool {
        self.outcome.is_some()
    }
}

/// A shard that finished: done, or failed for good.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ShardEnd {
    pub(crate) job: String,
    pub(crate) shard: u32,
    /// `done` or `failed`.
    pub(crate) outcome: &'static str,
    pub(crate) worker: String,
    pub(crate) host: String,
    pub(crate) at_ms: u64,
    pub(crate) records: u64,
    pub(crate) tokens: u64,
    /// Milliseconds of audio (speech shards).
    pub(crate) audio_ms: u64,
    pub(crate) reason: Option<String>,
}

/// Everything one batch of events changes.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Jobs the events name (their rows must exist first).
    pub(crate) jobs: BTreeMap<String, JobSeen>,
    pub(crate) attempts: BTreeMap<AttemptKey, AttemptRow>,
    /// Deliveries that started again: any earlier one of the shard still
    /// running has lost its worker (job, shard, the new attempt).
    pub(crate) redelivered: Vec<(String, u32, u64)>,
    /// In stream order: a shard may fail for good, be retried and be done.
    pub(crate) shard_ends: Vec<ShardEnd>,
    /// Workers seen: host, first and last event time.
    pub(crate) workers: BTreeMap<String, (String, u64, u64)>,
    /// Results a watchdog rejected: the delivery that reported it, and why.
    pub(crate) rejected: Vec<(AttemptKey, String)>,
}

/// What a batch says about a job as a whole.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct JobSeen {
    /// The earliest start of any of its shards in the batch.
    pub(crate) first_start_ms: Option<u64>,
    /// Its last event's time.
    pub(crate) last_ms: u64,
    /// Failed shards were queued again (`minions retry`).
    pub(crate) requeued: bool,
}

impl Plan {
    /// Folds `events`, in stream order.
    pub(crate) fn fold<'a>(events: impl IntoIterator<Item = &'a ShardEvent>) -> Plan {
        let mut p = Plan::default();
        for e in events {
            p.add(e);
        }
        p
    }

    fn add(&mut self, e: &ShardEvent) {
        let job = e.job.as_str().to_owned();
        let seen = self.jobs.entry(job.clone()).or_default();
        seen.last_ms = seen.last_ms.max(e.at_ms);
        if matches!(e.kind, EventKind::Started) {
            seen.first_start_ms = Some(seen.first_start_ms.map_or(e.at_ms, |t| t.min(e.at_ms)));
        }
        if matches!(e.kind, EventKind::Requeued) {
            seen.requeued = true;
        }
        if !e.from_worker() {
            if let EventKind::Rejected { by, reason, .. } = &e.kind {
                // A rejected done of this batch does not end its shard.
                self.shard_ends.retain(|end| {
                    !(end.job == job
                        && end.shard == e.shard
                        && end.worker == by.as_str()
                        && end.outcome == "done")
                });
                self.rejected.push((
                    AttemptKey {
                        job: job.clone(),
                        shard: e.shard,
                        attempt: e.attempt,
                        worker: by.as_str().to_owned(),
                    },
                    reason.clone(),
                ));
            }
            if let EventKind::Failed {
                reason,
                permanent: true,
                ..
            } = &e.kind
            {
                self.shard_ends.push(ShardEnd {
                    job,
                    shard: e.shard,
                    outcome: "failed",
                    worker: e.worker.as_str().to_owned(),
                    host: e.host.clone(),
                    at_ms: e.at_ms,
                    records: 0,
                    tokens: 0,
                    audio_ms: 0,
                    reason: Some(reason.clone()),
                });
            }
            return;
        }
        let worker = e.worker.as_str().to_owned();
        let w = self
            .workers
            .entry(worker.clone())
            .or_insert_with(|| (e.host.clone(), e.at_ms, e.at_ms));
        w.1 = w.1.min(e.at_ms);
        w.2 = w.2.max(e.at_ms);
        if matches!(
            e.kind,
            EventKind::Progress { .. }
                | EventKind::Submitted { .. }
                | EventKind::Rejected { .. }
                | EventKind::CheckQueued { .. }
                | EventKind::Verdict { .. }
        ) {
            return;
        }
        let key = AttemptKey {
            job: job.clone(),
            shard: e.shard,
            attempt: e.attempt,
            worker: worker.clone(),
        };
        let row = self.attempts.entry(key).or_insert_with(|| AttemptRow {
            host: e.host.clone(),
            ..Default::default()
        });
        match &e.kind {
            EventKind::Started => {
                row.started_ms = Some(e.at_ms);
                if e.attempt > 1 {
                    self.redelivered.push((job, e.shard, e.attempt));
                }
            }
            EventKind::Done {
                rows,
                duration_ms,
                compute_ms,
                already_done,
                tokens,
                audio_ms,
                ..
            } => {
                let outcome = if *already_done { "duplicate" } else { "done" };
                row.ran(e, *duration_ms, *compute_ms, outcome, *rows);
                row.tokens = *tokens;
                row.audio_ms = *audio_ms;
                self.shard_ends.push(ShardEnd {
                    job,
                    shard: e.shard,
                    outcome: "done",
                    worker,
                    host: e.host.clone(),
                    at_ms: e.at_ms,
                    records: *rows,
                    tokens: *tokens,
                    audio_ms: *audio_ms,
                    reason: None,
                });
            }
            // A check run: device time like any delivery; the shard does
            // not end by it.
            EventKind::Checked {
                rows,
                duration_ms,
                compute_ms,
                ..
            } => {
                row.ran(e, *duration_ms, *compute_ms, "check", *rows);
            }
            EventKind::Failed {
                reason, permanent, ..
            } => {
                row.ended_ms = Some(e.at_ms);
                row.outcome = Some("failed");
                row.reason = Some(reason.clone());
                row.energy = e.energy.clone();
                if *permanent {
                    self.shard_ends.push(ShardEnd {
                        job,
                        shard: e.shard,
                        outcome: "failed",
                        worker,
                        host: e.host.clone(),
                        at_ms: e.at_ms,
                        records: 0,
                        tokens: 0,
                        audio_ms: 0,
                        reason: Some(reason.clone()),
                    });
                }
            }
            EventKind::HandedBack { reason } => {
                row.ended_ms = Some(e.at_ms);
                row.outcome = Some("handed_back");
                row.reason = Some(reason.clone());
                row.energy = e.energy.clone();
            }
            EventKind::Requeued
            | EventKind::Progress { .. }
            | EventKind::Submitted { .. }
            | EventKind::Rejected { .. }
            | EventKind::CheckQueued { .. }
            | EventKind::Verdict { .. } => {}
        }
    }
}

/// One hour's part of a delivery: the hour's start and the ms in it.
pub(crate) fn split_hours(start_ms: u64, end_ms: u64) -> Vec<(u64, u64)> {
    const HOUR: u64 = 3_600_000;
    let mut out = Vec::new();
    if end_ms <= start_ms {
        out.push((end_ms - end_ms % HOUR, 0));
        return out;
    }
    let mut t = start_ms;
    while t < end_ms {
        let hour = t - t % HOUR;
        let next = (hour + HOUR).min(end_ms);
        out.push((hour, next - t));
        t = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::{IdError, JobId, SCHEMA_VERSION, WorkerId};

    fn ev(shard: u32, attempt: u64, worker: &str, at_ms: u64, kind: EventKind) -> ShardEvent {
        let mk = || -> Result<ShardEvent, IdError> {
            Ok(ShardEvent {
                v: SCHEMA_VERSION,
                job: JobId::new("j")?,
                shard,
                worker: WorkerId::new(worker)?,
                host: if worker == "wd" {
                    minions_schemas::messages::WATCHDOG_HOST.into()
                } else {
                    format!("{worker}-host")
                },
                attempt,
                at_ms,
                kind,
                energy: None,
            })
        };
        mk().unwrap_or_else(|e| panic!("{e}"))
    }

    fn done(ms: u64, already: bool) -> EventKind {
        EventKind::Done {
            rows: 10,
            output_bytes: 1,
            duration_ms: ms,
            compute_ms: ms / 2,
            already_done: already,
            sha256: String::new(),
            tokens: 3,
            audio_ms: 61_250,
            made_by: None,
        }
    }

    #[test]
    fn a_start_and_its_end_in_one_batch_make_one_row() {
        let p = Plan::fold(&[
            ev(0, 1, "a", 1_000, EventKind::Started),
            ev(0, 1, "a", 1_500, done(500, false)),
        ]);
        assert_eq!(p.attempts.len(), 1);
        let row = p.attempts.values().next().cloned().unwrap_or_default();
        assert_eq!(row.started_ms, Some(1_000));
        assert_eq!(row.busy_ms, Some(500));
        assert_eq!(row.outcome, Some("done"));
        assert_eq!((row.tokens, row.audio_ms), (3, 61_250));
        assert_eq!(p.shard_ends.len(), 1);
        assert_eq!(p.shard_ends[0].audio_ms, 61_250);
        assert_eq!(p.jobs.get("j").and_then(|j| j.first_start_ms), Some(1_000));
        assert_eq!(p.workers.get("a").map(|w| (w.1, w.2)), Some((1_000, 1_500)));
    }

    #[test]
    fn a_second_start_marks_the_shard_redelivered_and_a_late_done_is_a_duplicate() {
        let p = Plan::fold(&[
            ev(3, 1, "a", 1_000, EventKind::Started),
            ev(3, 2, "b", 9_000, EventKind::Started),
            ev(3, 2, "b", 9_400, done(400, true)),
        ]);
        assert_eq!(p.redelivered, vec![("j".to_owned(), 3, 2)]);
        let outcomes: Vec<_> = p.attempts.values().map(|r| r.outcome).collect();
        assert_eq!(outcomes, vec![None, Some("duplicate")]);
    }

    #[test]
    fn the_watchdogs_permanent_failure_ends_the_shard_but_is_no_delivery() {
        let p = Plan::fold(&[ev(
            5,
            4,
            "wd",
            2_000,
            EventKind::Failed {
                reason: "max deliveries".into(),
                permanent: true,
                stream_seq: None,
            },
        )]);
        assert!(p.attempts.is_empty());
        assert!(p.workers.is_empty());
        assert_eq!(p.shard_ends.len(), 1);
        assert_eq!(p.shard_ends[0].outcome, "failed");
    }

    #[test]
    fn a_rejected_done_ends_no_shard_and_names_its_delivery() {
        let rejected = EventKind::Rejected {
            by: WorkerId::new("a").unwrap_or_else(|e| panic!("{e}")),
            sha256: "00".into(),
            reason: "its output is not in the store".into(),
        };
        let p = Plan::fold(&[
            ev(2, 1, "a", 1_000, done(10, false)),
            ev(2, 1, "wd", 1_100, rejected.clone()),
            ev(2, 1, "b", 2_000, done(10, false)),
        ]);
        let ends: Vec<_> = p.shard_ends.iter().map(|e| e.worker.as_str()).collect();
        assert_eq!(ends, vec!["b"]);
        assert_eq!(p.rejected.len(), 1);
        assert_eq!(p.rejected[0].0.worker, "a");
        assert_eq!(p.rejected[0].0.attempt, 1);
        // Rejections from a worker are no watchdog's: ignored.
        let p = Plan::fold(&[ev(2, 1, "c", 1_100, rejected)]);
        assert!(p.rejected.is_empty() && p.attempts.is_empty());
    }

    #[test]
    fn progress_is_no_delivery_change() {
        let p = Plan::fold(&[ev(
            1,
            1,
            "a",
            5,
            EventKind::Progress {
                records: 1,
                tokens: 2,
                audio_ms: 0,
            },
        )]);
        assert!(p.attempts.is_empty());
    }

    #[test]
    fn hours_split_at_their_boundaries() {
        const H: u64 = 3_600_000;
        assert_eq!(split_hours(H - 100, H + 50), vec![(0, 100), (H, 50)]);
        assert_eq!(split_hours(10, 20), vec![(0, 10)]);
        assert_eq!(split_hours(2 * H, 2 * H), vec![(2 * H, 0)]);
        let parts = split_hours(100, 3 * H + 7);
        assert_eq!(parts.iter().map(|p| p.1).sum::<u64>(), 3 * H + 7 - 100);
        assert_eq!(parts.len(), 4);
    }
}
