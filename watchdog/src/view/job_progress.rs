//! Every job's progress, folded live from the events stream, with the
//! fleet's counters, a per-minute throughput history and each worker's
//! recent throughput.
//!
//! An open job is held with the fold of its shards; once its manifest is
//! written the tracker closes it to a frozen summary (a [`ClosedFold`],
//! whose size does not grow with the job), so that the view grows with open
//! work, not with history. The tracker also decides when a closed summary
//! is forgotten (the newest are kept) and when a job reopens.

use std::collections::{BTreeMap, HashMap, VecDeque};

use minions_schemas::messages::{EventKind, JobManifest, JobSpec, ShardEvent};
use minions_schemas::progress::{ClosedFold, JobFold, JobState, Progress};
use minions_schemas::{JobId, WorkerId};

use serde::{Deserialize, Serialize};

use super::counters::Counters;

/// Minutes of throughput history kept.
pub const HISTORY_MINUTES: u64 = 60;
/// The window of a worker's recent throughput.
pub const WORKER_WINDOW_MS: u64 = 60_000;

/// What the view holds of a job's shards.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Detail {
    /// An open job: the fold of its events.
    Open(Box<JobFold>),
    /// A finished job whose manifest is written: its progress, frozen.
    Closed(Box<ClosedFold>),
}

/// One job as the dashboard shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobEntry {
    /// Its fold while open, its frozen progress once closed.
    pub detail: Detail,
    /// Whether it was cancelled.
    pub cancelled: bool,
    /// The size of its model's files, MB (None when unknown).
    pub model_mb: Option<u64>,
    /// The last failure that will be retried: shard and reason.
    pub last_retry: Option<(u32, String)>,
}

impl JobEntry {
    /// The job's spec.
    pub fn spec(&self) -> &JobSpec {
        match &self.detail {
            Detail::Open(f) => f.spec(),
            Detail::Closed(c) => c.spec(),
        }
    }

    /// Whether it is closed (its manifest written, its shards forgotten).
    pub fn is_closed(&self) -> bool {
        matches!(self.detail, Detail::Closed(_))
    }

    /// Its progress at `now_ms`, with the cancellation applied.
    pub fn progress(&self, now_ms: u64) -> Progress {
        let mut p = match &self.detail {
            Detail::Open(f) => f.progress(now_ms),
            Detail::Closed(c) => c.progress().clone(),
        };
        if self.cancelled && p.state != JobState::Done {
            p.state = JobState::Cancelled;
        }
        p
    }
}

/// A worker's recent work.
#[derive(Debug, Default, Clone)]
struct Recent {
    /// Its first event seen (ms).
    first_ms: u64,
    /// (ms, records) of its shards done within the window.
    done: VecDeque<(u64, u64)>,
}

/// All jobs, the counters and the histories. A clone copies open jobs'
/// folds and closed jobs' summaries: what a checkpoint takes, so that
/// encoding it holds no lock.
#[derive(Debug, Default, Clone)]
pub struct JobsView {
    jobs: BTreeMap<JobId, JobEntry>,
    /// Fleet-wide counters.
    pub counters: Counters,
    /// (minute since the epoch, records done in it), oldest first.
    minutes: VecDeque<(u64, u64)>,
    /// Per worker: recent shards done.
    recent: HashMap<WorkerId, Recent>,
    /// Shards done since stale workers were last forgotten.
    since_purge: u64,
}

impl JobsView {
    /// Whether `job` is known.
    pub fn knows(&self, job: &JobId) -> bool {
        self.jobs.contains_key(job)
    }

    /// Adds a job (its events may follow).
    pub fn add(&mut self, spec: JobSpec, model_mb: Option<u64>, cancelled: bool) {
        let job = spec.job.clone();
        self.jobs.entry(job).or_insert_with(|| JobEntry {
            detail: Detail::Open(Box::new(JobFold::new(spec).checking_outputs())),
            cancelled,
            model_mb,
            last_retry: None,
        });
    }

    /// Adds a job found finished (its manifest `m` written) before any of
    /// its events was folded here: closed at once, its outcome counted
    /// from the manifest.
    pub fn add_closed(
        &mut self,
        spec: JobSpec,
        m: &JobManifest,
        model_mb: Option<u64>,
        cancelled: bool,
    ) {
        let job = spec.job.clone();
        if self.jobs.contains_key(&job) {
            return;
        }
        let closed = ClosedFold::from_record(spec, m);
        let p = closed.progress();
        let c = &mut self.counters;
        c.done += u64::from(p.done);
        c.failed += u64::from(p.failed);
        c.records += p.records_done;
        c.rejected += p.rejected;
        c.verified += u64::from(p.verified);
        c.disagreements += p.disagreements;
        self.jobs.insert(
            job,
            JobEntry {
                detail: Detail::Closed(Box::new(closed)),
                cancelled,
                model_mb,
                last_retry: None,
            },
        );
    }

    /// Closes an open job: its shards are forgotten, its progress at
    /// `now_ms` is kept.
    pub fn close(&mut self, job: &JobId, now_ms: u64) {
        let Some(mut j) = self.jobs.remove(job) else {
            return;
        };
        j.detail = match j.detail {
            Detail::Open(f) => Detail::Closed(Box::new(f.close(now_ms))),
            closed => closed,
        };
        self.jobs.insert(job.clone(), j);
    }

    /// Opens a closed job again, its shards as its manifest `m` records
    /// them (a retry or a withdrawn result follows).
    pub fn reopen(&mut self, job: &JobId, m: &JobManifest) {
        let Some(mut j) = self.jobs.remove(job) else {
            return;
        };
        j.detail = match j.detail {
            Detail::Closed(c) => Detail::Open(Box::new(c.reopen(m).checking_outputs())),
            open => open,
        };
        self.jobs.insert(job.clone(), j);
    }

    /// Forgets a job (a closed one past the number kept).
    pub fn forget(&mut self, job: &JobId) {
        self.jobs.remove(job);
    }

    /// Marks a job cancelled.
    pub fn cancel(&mut self, job: &JobId) {
        if let Some(j) = self.jobs.get_mut(job) {
            j.cancelled = true;
        }
    }

    /// One job.
    pub fn get(&self, job: &JobId) -> Option<&JobEntry> {
        self.jobs.get(job)
    }

    /// Every job, oldest id first.
    pub fn iter(&self) -> impl Iterator<Item = &JobEntry> {
        self.jobs.values()
    }

    /// Applies an event of a known open job; counts what it changes. The
    /// events of a closed job change nothing (the tracker reopens a job
    /// that moves again first).
    pub fn apply(&mut self, e: &ShardEvent) {
        let Some(j) = self.jobs.get_mut(&e.job) else {
            return;
        };
        let Detail::Open(fold) = &mut j.detail else {
            return;
        };
        let was_done = fold.is_done(e.shard);
        let was_failed = fold.is_failed(e.shard);
        fold.apply(e);
        let now_done = !was_done && fold.is_done(e.shard);
        let rows = fold.spec().shard_rows(e.shard);
        let now_failed = !was_failed && fold.is_failed(e.shard);
        if e.worker.as_str() != minions_schemas::messages::CLI_SENDER {
            self.recent
                .entry(e.worker.clone())
                .or_insert_with(|| Recent {
                    first_ms: e.at_ms,
                    done: VecDeque::new(),
                });
        }
        let c = &mut self.counters;
        match &e.kind {
            EventKind::Started if e.attempt > 1 => c.redeliveries += 1,
            EventKind::Submitted { .. }
            | EventKind::Started
            | EventKind::Requeued
            | EventKind::Progress { .. }
            | EventKind::Checked { .. } => {}
            EventKind::Done { .. } => {
                if now_done {
                    self.count_done(e, rows);
                }
            }
            EventKind::Rejected { .. } => {
                if e.from_watchdog() {
                    c.rejected += 1;
                }
            }
            EventKind::CheckQueued { .. } => {}
            EventKind::Verdict {
                outcome, outvoted, ..
            } => {
                if e.from_watchdog() {
                    use minions_schemas::messages::VerdictOutcome as O;
                    match outcome {
                        O::Agreed | O::Decided => c.verified += 1,
                        O::Disagreed => c.disagreements += 1,
                        O::Undecided => {}
                    }
                    c.outvoted += outvoted.len() as u64;
                }
            }
            EventKind::HandedBack { reason } => {
                c.handed_back += 1;
                if reason.starts_with("owner") {
                    c.owner_handbacks += 1;
                }
            }
            EventKind::Failed {
                reason, permanent, ..
            } => {
                if *permanent {
                    if now_failed {
                        c.failed += 1;
                    }
                } else {
                    c.retried += 1;
                    j.last_retry = Some((e.shard, reason.clone()));
                }
            }
        }
    }

    /// Counts the result of a known open job's done event once the
    /// tracker found its output backing it (the job's fold holds a
    /// worker's result until then).
    pub fn backed(&mut self, e: &ShardEvent) {
        let Some(j) = self.jobs.get_mut(&e.job) else {
            return;
        };
        let Detail::Open(fold) = &mut j.detail else {
            return;
        };
        let was_done = fold.is_done(e.shard);
        fold.backed(e);
        if !was_done && fold.is_done(e.shard) {
            let rows = fold.spec().shard_rows(e.shard);
            self.count_done(e, rows);
        }
    }

    /// Counts a shard done by the done event `e` (`rows` records) in the
    /// counters and histories.
    fn count_done(&mut self, e: &ShardEvent, rows: u64) {
        let EventKind::Done {
            duration_ms,
            tokens,
            audio_ms,
            ..
        } = &e.kind
        else {
            return;
        };
        let c = &mut self.counters;
        c.done += 1;
        c.records += rows;
        c.tokens += tokens;
        c.audio_ms += audio_ms;
        c.durations.observe(*duration_ms as f64 / 1000.0);
        record_minute(&mut self.minutes, e.at_ms, rows);
        if let Some(w) = self.recent.get_mut(&e.worker) {
            w.done.push_back((e.at_ms, rows));
            trim_recent(&mut w.done, e.at_ms);
        }
        self.since_purge += 1;
        if self.since_purge >= 1000 {
            // Forget workers with nothing done within the window.
            self.since_purge = 0;
            let since = e.at_ms.saturating_sub(WORKER_WINDOW_MS);
            self.recent
                .retain(|_, w| w.done.back().is_some_and(|(t, _)| *t >= since));
        }
    }

    /// Records per minute over the last [`HISTORY_MINUTES`] minutes ending
    /// at `now_ms`, oldest first (always that many entries).
    pub fn history(&self, now_ms: u64) -> Vec<u64> {
        let now_min = now_ms / 60_000;
        (0..HISTORY_MINUTES)
            .rev()
            .map(|ago| {
                now_min.checked_sub(ago).map_or(0, |m| {
                    self.minutes
                        .iter()
                        .find(|(k, _)| *k == m)
                        .map_or(0, |(_, n)| *n)
                })
            })
            .collect()
    }

    /// A worker's records per second over the last minute, or since its
    /// first event when that is more recent (at least 5 s).
    pub fn worker_rate(&self, worker: &WorkerId, now_ms: u64) -> f64 {
        self.recent.get(worker).map_or(0.0, |w| {
            let since = now_ms.saturating_sub(WORKER_WINDOW_MS);
            let n: u64 = w
                .done
                .iter()
                .filter(|(t, _)| *t >= since)
                .map(|(_, r)| r)
                .sum();
            let span_ms = now_ms
                .saturating_sub(w.first_ms)
                .clamp(5_000, WORKER_WINDOW_MS);
            n as f64 / (span_ms as f64 / 1000.0)
        })
    }
}

/// A worker's recent work as saved, borrowed: its first event's time and
/// the `(ms, records)` pairs of its shards done within the window.
#[derive(Serialize)]
struct SavedRecentRef<'a> {
    worker: &'a WorkerId,
    first_ms: u64,
    done: &'a VecDeque<(u64, u64)>,
}

/// The owned form of [`SavedRecentRef`].
#[derive(Debug, Deserialize)]
struct SavedRecent {
    worker: WorkerId,
    #[serde(default)]
    first_ms: u64,
    #[serde(default)]
    done: VecDeque<(u64, u64)>,
}

/// The jobs view as a checkpoint saves it, borrowed (nothing is copied to
/// save it). Its layout is that of [`SavedJobs`]; workers are sorted by id
/// so that equal views save to equal bytes.
#[derive(Serialize)]
pub struct SavedJobsRef<'a> {
    jobs: Vec<&'a JobEntry>,
    counters: &'a Counters,
    minutes: &'a VecDeque<(u64, u64)>,
    recent: Vec<SavedRecentRef<'a>>,
    since_purge: u64,
}

/// The jobs view as a checkpoint holds it; [`JobsView::restore`] turns it
/// back into a view.
#[derive(Debug, Deserialize)]
pub struct SavedJobs {
    jobs: Vec<JobEntry>,
    counters: Counters,
    minutes: VecDeque<(u64, u64)>,
    recent: Vec<SavedRecent>,
    since_purge: u64,
}

/// A saved jobs view that cannot be restored.
#[derive(Debug, thiserror::Error)]
#[error("the saved jobs view holds job {0} twice")]
pub struct DuplicateJob(pub JobId);

impl JobsView {
    /// The view, borrowed in its saved form.
    pub fn saved(&self) -> SavedJobsRef<'_> {
        let mut recent: Vec<_> = self
            .recent
            .iter()
            .map(|(worker, r)| SavedRecentRef {
                worker,
                first_ms: r.first_ms,
                done: &r.done,
            })
            .collect();
        recent.sort_by(|a, b| a.worker.cmp(b.worker));
        SavedJobsRef {
            jobs: self.jobs.values().collect(),
            counters: &self.counters,
            minutes: &self.minutes,
            recent,
            since_purge: self.since_purge,
        }
    }

    /// The view a checkpoint saved; refuses one that holds a job twice.
    pub fn restore(saved: SavedJobs) -> Result<Self, DuplicateJob> {
        let mut jobs = BTreeMap::new();
        for j in saved.jobs {
            let id = j.spec().job.clone();
            if jobs.insert(id.clone(), j).is_some() {
                return Err(DuplicateJob(id));
            }
        }
        Ok(Self {
            jobs,
            counters: saved.counters,
            minutes: saved.minutes,
            recent: saved
                .recent
                .into_iter()
                .map(|r| {
                    let recent = Recent {
                        first_ms: r.first_ms,
                        done: r.done,
                    };
                    (r.worker, recent)
                })
                .collect(),
            since_purge: saved.since_purge,
        })
    }

    /// Open jobs marked cancelled with no shard running: they will not
    /// complete (their queued shards were purged), so the tracker closes
    /// them.
    pub fn cancelled_idle(&self) -> Vec<JobId> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.cancelled && !j.is_closed() && j.progress(0).running == 0)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Jobs not done and not marked cancelled: a cancellation sent while
    /// no watchdog listened is found only by looking at the store.
    pub fn open_uncancelled(&self) -> Vec<JobId> {
        self.jobs
            .iter()
            .filter(|(_, j)| {
                !j.cancelled && !j.is_closed() && j.progress(0).state != JobState::Done
            })
            .map(|(id, _)| id.clone())
            .collect()
    }
}

fn record_minute(minutes: &mut VecDeque<(u64, u64)>, at_ms: u64, rows: u64) {
    let m = at_ms / 60_000;
    match minutes.iter_mut().find(|(k, _)| *k == m) {
        Some((_, n)) => *n += rows,
        None => {
            minutes.push_back((m, rows));
            minutes.make_contiguous().sort_by_key(|(k, _)| *k);
        }
    }
    let newest = minutes.back().map_or(m, |(k, _)| *k);
    while minutes
        .front()
        .is_some_and(|(k, _)| *k + HISTORY_MINUTES <= newest)
    {
        minutes.pop_front();
    }
}

fn trim_recent(w: &mut VecDeque<(u64, u64)>, now_ms: u64) {
    let since = now_ms.saturating_sub(WORKER_WINDOW_MS);
    while w.front().is_some_and(|(t, _)| *t < since) {
        w.pop_front();
    }
}

/// Fixtures of the crate's unit tests.
#[cfg(test)]
pub(crate) mod fixtures {
    /// The spec of job `job` of model `m`: `shards` shards of 10 records,
    /// `records` in all.
    pub(crate) use minions_schemas::messages::test_spec_of as spec;
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::IdError;

    fn ev(shard: u32, attempt: u64, at_ms: u64, kind: EventKind) -> Result<ShardEvent, IdError> {
        ShardEvent::test_event(shard, attempt, at_ms, kind)
    }

    fn done(ms: u64) -> EventKind {
        EventKind::Done {
            rows: 10,
            output_bytes: 1,
            duration_ms: ms,
            compute_ms: ms,
            already_done: false,
            sha256: String::new(),
            tokens: 0,
            audio_ms: 0,
            made_by: None,
        }
    }

    #[test]
    fn counts_each_shard_once() -> Result<(), IdError> {
        let mut v = JobsView::default();
        v.add(fixtures::spec("j", 3, 25)?, Some(1), false);
        let t = 120_000;
        for e in [
            ev(0, 1, t, EventKind::Started)?,
            ev(0, 1, t + 10, done(1500))?,
            ev(0, 2, t + 20, EventKind::Started)?,
            ev(0, 2, t + 30, done(10))?,
            ev(
                1,
                1,
                t,
                EventKind::HandedBack {
                    reason: "owner: input 0 s ago".into(),
                },
            )?,
            ev(
                1,
                2,
                t,
                EventKind::Failed {
                    reason: "net".into(),
                    permanent: false,
                    stream_seq: None,
                },
            )?,
            ev(
                2,
                5,
                t,
                EventKind::Failed {
                    reason: "bad".into(),
                    permanent: true,
                    stream_seq: None,
                },
            )?,
            ev(
                2,
                5,
                t,
                EventKind::Failed {
                    reason: "bad".into(),
                    permanent: true,
                    stream_seq: None,
                },
            )?,
        ] {
            v.apply(&e);
            // A worker's result counts once the tracker finds its output.
            if matches!(e.kind, EventKind::Done { .. }) {
                v.backed(&e);
            }
        }
        let c = &v.counters;
        assert_eq!(
            (
                c.done,
                c.failed,
                c.retried,
                c.handed_back,
                c.owner_handbacks
            ),
            (1, 1, 1, 1, 1)
        );
        assert_eq!((c.records, c.redeliveries, c.durations.count), (10, 1, 1));
        let h = v.history(t + 60_000);
        assert_eq!(h.len() as u64, HISTORY_MINUTES);
        assert_eq!(h[h.len() - 2], 10);
        let w = WorkerId::new("w")?;
        // First seen at t: 10 records over the 5 s floor, then over a minute.
        assert!((v.worker_rate(&w, t + 100) - 10.0 / 5.0).abs() < 1e-9);
        assert!((v.worker_rate(&w, t + 30_000) - 10.0 / 30.0).abs() < 1e-9);
        assert_eq!(v.worker_rate(&w, t + 120_000), 0.0);
        Ok(())
    }
}
