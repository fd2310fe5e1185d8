//! Closed jobs: once a job's manifest is written (the manifest, the events
//! stream and the ledger are the record of a finished job), the tracker
//! drops its per-shard detail and the view keeps a frozen summary, so that
//! memory and checkpoints grow with open shards, not with history.
//!
//! A job the tracker has never seen whose manifest is already in the store
//! (a full replay, a late event) is closed at first sight, from that
//! manifest. The events of a closed job change nothing, except those that
//! move it again: a retry's `requeued` and a watchdog's `rejected` reopen
//! it from its manifest (the record of every shard), as does the
//! quarantine of a machine whose results it holds. The newest
//! [`Closed::keep`] closed jobs are remembered; older ones are forgotten
//! (their manifests answer for them).

use std::collections::{HashMap, VecDeque};

use minions_schemas::messages::{EventKind, JobManifest, ShardEvent};
use minions_schemas::progress::{Counts, ShardFold};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, subjects};

use super::{DoneBy, JobTrack, ShardTrack, SpecRead, Tracker};

/// Closed jobs remembered by default.
pub const DEFAULT_FINISHED_KEPT: usize = 1000;

/// The closed jobs remembered, oldest first, each with whether it was
/// complete before this watchdog looked (a quarantine withdraws results
/// only from jobs that completed while it watched).
#[derive(Debug)]
pub(crate) struct Closed {
    sealed_before: HashMap<JobId, bool>,
    order: VecDeque<JobId>,
    keep: usize,
}

impl Closed {
    /// None remembered; at most `keep` will be.
    pub(crate) fn new(keep: usize) -> Self {
        Self {
            sealed_before: HashMap::new(),
            order: VecDeque::new(),
            keep: keep.max(1),
        }
    }

    /// How many are remembered at most.
    pub(crate) fn keep(&self) -> usize {
        self.keep
    }

    /// Whether `job` is closed here.
    pub(crate) fn contains(&self, job: &JobId) -> bool {
        self.sealed_before.contains_key(job)
    }

    /// Remembers `job` as closed; returns the jobs forgotten to make room.
    pub(crate) fn insert(&mut self, job: JobId, sealed_before: bool) -> Vec<JobId> {
        if self
            .sealed_before
            .insert(job.clone(), sealed_before)
            .is_none()
        {
            self.order.push_back(job);
        }
        let mut forgotten = Vec::new();
        while self.order.len() > self.keep {
            if let Some(old) = self.order.pop_front() {
                self.sealed_before.remove(&old);
                forgotten.push(old);
            }
        }
        forgotten
    }

    /// Forgets that `job` is closed (it reopens).
    pub(crate) fn remove(&mut self, job: &JobId) -> Option<bool> {
        let was = self.sealed_before.remove(job)?;
        self.order.retain(|j| j != job);
        Some(was)
    }

    /// The closed jobs, oldest first.
    pub(crate) fn ids(&self) -> impl Iterator<Item = &JobId> {
        self.order.iter()
    }

    /// Closed jobs that completed while this watchdog watched.
    fn completed_here(&self) -> Vec<JobId> {
        self.order
            .iter()
            .filter(|j| self.sealed_before.get(*j) == Some(&false))
            .cloned()
            .collect()
    }
}

/// Whether an event moves a finished job again: a retry of its failed
/// shards, or a watchdog withdrawing one of its results.
fn reopens(e: &ShardEvent) -> bool {
    match e.kind {
        EventKind::Requeued => true,
        EventKind::Rejected { .. } => e.from_watchdog(),
        _ => false,
    }
}

/// What reading a job's manifest found.
enum ManifestRead {
    Found(Box<JobManifest>),
    Missing,
    Failed(String),
}

impl Tracker {
    /// Before an event is folded: closes at first sight a job found
    /// finished, and reopens a closed job that the event moves again.
    /// False when the event changes nothing here (its job is closed).
    pub(super) async fn admit(&mut self, e: &ShardEvent) -> bool {
        if !self.jobs.contains_key(&e.job) && !self.closed.contains(&e.job) {
            self.first_sight(&e.job).await;
        }
        if !self.closed.contains(&e.job) {
            return true;
        }
        reopens(e) && self.reopen(&e.job).await
    }

    /// The first event of a job not known here: a job whose manifest is
    /// written is closed at once (its events are not folded again);
    /// another is opened.
    async fn first_sight(&mut self, job: &JobId) {
        match self.manifest(job).await {
            ManifestRead::Found(m) => {
                let SpecRead::Found(spec) = self.spec(job).await else {
                    // Without its spec the view cannot show it; the events
                    // are folded as those of an open job, as before.
                    self.open(job, None);
                    return;
                };
                self.view.jobs().add_closed(*spec, &m, None, false);
                self.remember_closed(job.clone(), true);
            }
            ManifestRead::Missing => self.open(job, Some(false)),
            // Looked at again when the job completes.
            ManifestRead::Failed(why) => {
                tracing::warn!(job = %job, error = %why, "a job's manifest could not be read; its events are folded");
                self.open(job, None);
            }
        }
    }

    fn open(&mut self, job: &JobId, sealed: Option<bool>) {
        let t = self.jobs.entry(job.clone()).or_default();
        if t.sealed.is_none() {
            t.sealed = sealed;
        }
    }

    /// Closes `job` when its manifest is written and nothing about it waits
    /// (open checks, dead letters, check rounds, strikes): its detail
    /// leaves memory, the view keeps its progress.
    pub(super) fn maybe_close(&mut self, job: &JobId) {
        let Some(t) = self.jobs.get(job) else {
            return;
        };
        let complete = t.settled() && t.manifest == Some(t.outcome());
        if !complete || t.tally.checking > 0 || self.waits_on(job) {
            return;
        }
        let sealed_before = t.sealed == Some(true);
        self.close_now(job, sealed_before);
    }

    /// Closes a cancelled job once none of its shards runs: it will not
    /// complete (its queued shards were purged), so no manifest closes it.
    pub(super) fn close_cancelled(&mut self, job: &JobId) {
        if !self.jobs.contains_key(job) || self.waits_on(job) {
            return;
        }
        self.close_now(job, true);
    }

    /// Drops `job`'s detail, freezes its view entry and remembers it
    /// closed.
    fn close_now(&mut self, job: &JobId, sealed_before: bool) {
        self.jobs.remove(job);
        self.view.jobs().close(job, now_ms());
        self.remember_closed(job.clone(), sealed_before);
    }

    /// Whether a retry queue holds something of `job`.
    fn waits_on(&self, job: &JobId) -> bool {
        self.retries.holds(job) || self.queued_checks.iter().any(|e| e.job == *job)
    }

    fn remember_closed(&mut self, job: JobId, sealed_before: bool) {
        for old in self.closed.insert(job, sealed_before) {
            self.view.jobs().forget(&old);
        }
    }

    /// Opens a closed job again from its manifest; false (with a warning)
    /// when the manifest cannot be read.
    pub(crate) async fn reopen(&mut self, job: &JobId) -> bool {
        match self.manifest(job).await {
            ManifestRead::Found(m) => {
                self.reopen_from(job, &m).await;
                true
            }
            ManifestRead::Missing => {
                tracing::warn!(job = %job, "a closed job moved again but its manifest is gone; the event is ignored");
                false
            }
            ManifestRead::Failed(why) => {
                tracing::warn!(job = %job, error = %why, "a closed job moved again but its manifest could not be read; the event is ignored");
                false
            }
        }
    }

    async fn reopen_from(&mut self, job: &JobId, m: &JobManifest) {
        let Some(sealed_before) = self.closed.remove(job) else {
            return;
        };
        let spec = match self.spec(job).await {
            SpecRead::Found(spec) => Some(*spec),
            _ => None,
        };
        let mut t = JobTrack {
            spec,
            manifest: Some((m.done, m.failed)),
            sealed: Some(sealed_before),
            ..Default::default()
        };
        for s in &m.shards {
            let maker = s.made_by.as_ref().map(|p| t.intern(p));
            let track = if s.outcome == "done" {
                ShardTrack {
                    fold: ShardFold::recorded(
                        Some(s.sha256.as_deref().unwrap_or_default()),
                        None,
                        s.attempts,
                    ),
                    done: s.worker.clone().map(|worker| DoneBy {
                        worker,
                        sha256: s.sha256.clone().unwrap_or_default(),
                        ms: s.duration_ms,
                    }),
                    maker,
                    // Its check, if it was picked for one, is over (the
                    // manifest waited for it). A picked shard is picked
                    // again by the same key: a new round 1 would carry the
                    // ids of the one that ran, be dropped as a duplicate
                    // and hold the job open for good.
                    check: Some(Box::default()),
                    ..Default::default()
                }
            } else {
                ShardTrack {
                    fold: ShardFold::recorded(
                        None,
                        Some(s.reason.clone().unwrap_or_else(|| s.outcome.clone())),
                        s.attempts,
                    ),
                    ..Default::default()
                }
            };
            t.tally.shard(Counts::default(), track.fold.counts());
            t.shards.insert(s.shard, track);
        }
        // The record's counts that its shards do not hold.
        t.tally.rejected = m.rejected;
        t.tally.verified = m.verified;
        t.tally.disagreements = m.disagreements;
        t.tally.unverified = m.unverified;
        let (done, failed) = t.outcome();
        tracing::info!(job = %job, done, failed, "a finished job moves again; reopened from its manifest");
        self.jobs.insert(job.clone(), t);
        if self.view.jobs().get(job).is_some() {
            self.view.jobs().reopen(job, m);
        }
    }

    /// Reopens the closed jobs that completed while this watchdog watched
    /// and hold a result made on `machine` (being quarantined), so that
    /// those results can be withdrawn.
    pub(super) async fn reopen_made_on(&mut self, machine: &str) {
        for job in self.closed.completed_here() {
            let ManifestRead::Found(m) = self.manifest(&job).await else {
                continue;
            };
            let holds = m.shards.iter().any(|s| {
                s.worker
                    .as_ref()
                    .is_some_and(|w| subjects::machine(w) == machine)
            });
            if holds {
                self.reopen_from(&job, &m).await;
            }
        }
    }

    async fn manifest(&self, job: &JobId) -> ManifestRead {
        match minions_endpoints::manifest::latest(self.store.as_ref(), job).await {
            Ok(Some((_, m))) => ManifestRead::Found(Box::new(m)),
            Ok(None) => ManifestRead::Missing,
            Err(e) => ManifestRead::Failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_closed_jobs_are_kept() -> Result<(), minions_schemas::IdError> {
        let mut c = Closed::new(2);
        assert!(c.insert(JobId::new("a")?, false).is_empty());
        assert!(c.insert(JobId::new("b")?, true).is_empty());
        // Again: no second place.
        assert!(c.insert(JobId::new("a")?, false).is_empty());
        assert_eq!(c.insert(JobId::new("c")?, false), vec![JobId::new("a")?]);
        assert!(!c.contains(&JobId::new("a")?));
        assert_eq!(c.completed_here(), vec![JobId::new("c")?]);
        assert_eq!(c.remove(&JobId::new("b")?), Some(true));
        assert_eq!(c.ids().collect::<Vec<_>>(), vec![&JobId::new("c")?]);
        Ok(())
    }
}
