//! The job tracker: follows every shard event, writes a dead-letter record
//! for each shard that failed for good, and a job manifest when every shard
//! of a job is done or failed. Both writes are idempotent (message ids, a
//! check of what is already there, create-or-compare puts), so several
//! watchdogs, or one that restarts and replays the events, write each once.
//! It also folds every event into the shared [`View`] for the dashboard.
//!
//! Each shard steps the one state machine that every reader of a job
//! steps ([`minions_schemas::progress::shard`]: the dashboard's fold and
//! `minions status` too): a pure function of the state and one event that
//! returns the [`Effect`]s the event asks for (an output check, a strike,
//! a verification pick, a judgement, a dead-letter record, a completion
//! check). A `JobTrack` keeps beside it the record the manifest needs (who
//! made each result, on which hosts it ran), as the effects say.
//! `Tracker::carry_out` does the rest; what fails for now (the store or
//! NATS down) waits in the one retry queue (`retry`), tried again each
//! tick. A worker's result counts once its output backs it: the machine
//! holds it as reported until the check, in the tracker and the view
//! alike.
//! A job's detail is held only while it is open: once its manifest is
//! written it is closed ([`closed`]), so memory grows with open work.
//!
//! Its state (and the view's jobs) can be saved and restored as a
//! checkpoint ([`crate::checkpoint`]): what it has folded records what it
//! has already written (each job's last manifest outcome) and what it could
//! not write yet (dead letters to retry), so that a watchdog that resumes
//! from a checkpoint neither rewrites nor loses any of it.

use std::collections::{BTreeMap, HashMap, VecDeque};

use async_nats::jetstream;
use minions_endpoints::resilient;
use minions_schemas::messages::{
    DeadLetter, EventKind, JobManifest, JobSpec, ManifestShard, ModelManifest, Provenance,
    ShardEvent,
};
use minions_schemas::progress::{Effect, Reports, ShardFold, Step, Tally};
use minions_schemas::time::now_ms;
use minions_schemas::{
    JobId, SCHEMA_VERSION, WorkerId, decode, encode, keys, limits, streams, subjects,
};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};

use crate::trust::backing::{Backing, BackingError};
use crate::view::View;

mod closed;
mod retry;
pub mod strikes;
mod verify;
use closed::Closed;
pub use closed::DEFAULT_FINISHED_KEPT;
use retry::{Retries, Retry};
use verify::CheckTrack;
pub use verify::JudgeResult;

/// The result that makes a shard done: who made it, its output's SHA-256
/// and how long its run took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct DoneBy {
    worker: WorkerId,
    sha256: String,
    ms: u64,
}

/// One shard as the tracker holds it: the state machine every reader of
/// the job steps ([`ShardFold`]: which result counts, failed for good, its
/// check's rounds) and the record the manifest and dead letters need
/// beside it, kept as the machine's effects say.
#[derive(Debug, Default, Clone)]
struct ShardTrack {
    fold: ShardFold,
    /// Who made the result that counts (Some exactly when the fold counts
    /// one, except a result reopened from a record that names no worker).
    done: Option<DoneBy>,
    hosts: Vec<String>,
    /// What made its output: an index into its job's `makers`.
    maker: Option<u32>,
    /// Its check by other machines' runs, once one was queued or ran.
    check: Option<Box<CheckTrack>>,
}

#[derive(Debug, Default, Clone)]
struct JobTrack {
    spec: Option<JobSpec>,
    shards: BTreeMap<u32, ShardTrack>,
    /// The job's counts as its shards' machines make them, kept as events
    /// arrive (a count per event would cost a scan of every shard:
    /// quadratic in the job's size).
    tally: Tally,
    /// (done, failed) counts of the last manifest written or found.
    manifest: Option<(u32, u32)>,
    /// The distinct makers (build, device, kernel path) of its outputs;
    /// shards name theirs by index (a fleet has few, a job many shards).
    makers: Vec<Provenance>,
    /// Whether its manifest was in the store when its first `done` was
    /// checked, or the checkpoint it was restored from says it was written
    /// (None: not looked yet). The done events of a job that was complete
    /// before are not checked again: its outputs may be gone (collected
    /// and removed) long after.
    sealed: Option<bool>,
}

impl JobTrack {
    /// Steps one shard event through its shard's machine and keeps the
    /// record beside it; returns what the event asks the tracker to do
    /// ([`Effect`], in order; [`Effect::CheckOutput`] first when a
    /// worker's result waits for its output check).
    fn step(&mut self, e: &ShardEvent) -> Vec<Effect> {
        self.step_counting(e, true)
    }

    fn step_counting(&mut self, e: &ShardEvent, count_rejection: bool) -> Vec<Effect> {
        let maker = match &e.kind {
            EventKind::Checked {
                made_by: Some(p), ..
            } => Some(self.intern(p)),
            _ => None,
        };
        let s = self.shards.entry(e.shard).or_default();
        match &e.kind {
            EventKind::Started if s.hosts.last() != Some(&e.host) => {
                s.hosts.push(e.host.clone());
            }
            EventKind::CheckQueued { round, .. } if e.from_watchdog() => {
                let c = s.check.get_or_insert_with(Default::default);
                if *round > s.fold.round() {
                    c.queued_ms = e.at_ms;
                }
            }
            EventKind::Checked { round, sha256, .. } if e.from_worker() => {
                s.check
                    .get_or_insert_with(Default::default)
                    .record(*round, &e.worker, sha256, maker);
            }
            EventKind::Verdict { .. } if e.from_watchdog() => {
                s.check.get_or_insert_with(Default::default);
            }
            _ => {}
        }
        let mut step = s.fold.step(e, Reports::Checked);
        step.rejected &= count_rejection;
        self.follow(e, &step, None);
        step.effects
    }

    /// Counts the result of the done event `e`, whose output a check found
    /// backing it; `made_on`: the writer its output names, when read.
    fn backed(&mut self, e: &ShardEvent, made_on: Option<&WorkerId>) -> Vec<Effect> {
        let s = self.shards.entry(e.shard).or_default();
        let step = s.fold.backed(e);
        self.follow(e, &step, made_on);
        step.effects
    }

    /// Keeps the counts and the record as `step` of `e` says.
    ///
    /// A result counts as made by its sender, except a delivery's report of
    /// an output it found already written (`already_done`): that goes to
    /// `made_on`, the writer the output names, when known (the machine
    /// leaves a result already counted for it as it is). A quarantine must
    /// withdraw a result from the machine that made it, whichever delivery
    /// reported it last.
    fn follow(&mut self, e: &ShardEvent, step: &Step, made_on: Option<&WorkerId>) {
        self.tally.add(step);
        let made_by = match &e.kind {
            EventKind::Done {
                made_by: Some(p), ..
            } if step.effects.contains(&Effect::Counted) => Some(self.intern(p)),
            _ => None,
        };
        let Some(s) = self.shards.get_mut(&e.shard) else {
            return;
        };
        for effect in &step.effects {
            match (effect, &e.kind) {
                (
                    Effect::Counted,
                    EventKind::Done {
                        sha256,
                        duration_ms,
                        already_done,
                        ..
                    },
                ) => {
                    let by = match made_on {
                        Some(w) if *already_done => w,
                        _ => &e.worker,
                    };
                    s.done = Some(DoneBy {
                        worker: by.clone(),
                        sha256: sha256.clone(),
                        ms: *duration_ms,
                    });
                    s.maker = made_by;
                }
                (Effect::Stands { worker }, EventKind::Verdict { sha256, .. }) => {
                    let ms = s.done.as_ref().map_or(0, |d| d.ms);
                    s.done = Some(DoneBy {
                        worker: worker.clone(),
                        sha256: sha256.clone(),
                        ms,
                    });
                    s.maker = s.check.as_ref().and_then(|c| c.maker_of(worker, sha256));
                    self.manifest = None;
                }
                (Effect::Withdrawn, _) => {
                    s.done = None;
                    s.maker = None;
                    self.manifest = None;
                }
                _ => {}
            }
        }
    }

    /// Withdraws the result that the rejection `e` names, without counting
    /// the rejection (its copy from the stream counts it).
    fn withdraw(&mut self, e: &ShardEvent) {
        self.step_counting(e, false);
    }

    /// The index of `p` in the job's makers, added when new.
    fn intern(&mut self, p: &Provenance) -> u32 {
        let i = match self.makers.iter().position(|m| m == p) {
            Some(i) => i,
            None => {
                self.makers.push(p.clone());
                self.makers.len() - 1
            }
        };
        u32::try_from(i).unwrap_or(u32::MAX)
    }

    /// (done, failed) shards now.
    fn outcome(&self) -> (u32, u32) {
        (self.tally.done, self.tally.failed)
    }

    /// Whether every shard is done or failed for good.
    fn settled(&self) -> bool {
        let (done, failed) = self.outcome();
        self.spec
            .as_ref()
            .is_some_and(|s| done + failed >= s.shards)
    }
}

/// Checks a worker's done event against the store ([`crate::trust::backing`]).
async fn check_done(store: std::sync::Arc<dyn ObjectStore>, e: ShardEvent) -> CheckResult {
    let r = match &e.kind {
        EventKind::Done { sha256, rows, .. } => {
            crate::trust::backing::check(store.as_ref(), &e.job, e.shard, sha256, *rows).await
        }
        _ => Ok(Backing::Mismatch("not a done event".to_owned())),
    };
    (e, r)
}

/// A dead-letter record that could not be written yet; retried by
/// [`Tracker::resume`] (and saved with a checkpoint, so it is not lost).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDead {
    /// The job.
    pub job: JobId,
    /// The shard that failed for good.
    pub shard: u32,
    /// Why.
    pub reason: String,
    /// The delivery it failed on (the record's message id carries it).
    pub attempt: u64,
    /// The work-stream sequence of the task message (0: not known).
    #[serde(default)]
    pub stream_seq: u64,
}

/// One shard's track as a checkpoint saves it, borrowed: named fields, so
/// that a field added later (with a default) leaves older checkpoints
/// readable. Its layout is that of [`SavedShard`].
#[derive(Serialize)]
struct SavedShardRef<'a> {
    shard: u32,
    fold: &'a ShardFold,
    done: &'a Option<DoneBy>,
    hosts: &'a [String],
    maker: Option<u32>,
    check: &'a Option<Box<CheckTrack>>,
}

/// The owned form of [`SavedShardRef`].
#[derive(Deserialize)]
struct SavedShard {
    shard: u32,
    #[serde(default)]
    fold: ShardFold,
    #[serde(default)]
    done: Option<DoneBy>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    maker: Option<u32>,
    #[serde(default)]
    check: Option<Box<CheckTrack>>,
}

struct SavedShardsRef<'a>(&'a BTreeMap<u32, ShardTrack>);

impl Serialize for SavedShardsRef<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(self.0.iter().map(|(&shard, s)| SavedShardRef {
            shard,
            fold: &s.fold,
            done: &s.done,
            hosts: &s.hosts,
            maker: s.maker,
            check: &s.check,
        }))
    }
}

/// A job's last manifest counts as saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct SavedCounts {
    done: u32,
    failed: u32,
}

#[derive(Serialize)]
pub(crate) struct SavedJobRef<'a> {
    job: &'a JobId,
    spec: &'a Option<JobSpec>,
    shards: SavedShardsRef<'a>,
    manifest: Option<SavedCounts>,
    makers: &'a [Provenance],
    rejected: u32,
    disagreements: u32,
    /// Shards verified (a job reopened from its manifest carries the
    /// manifest's count, which its shards do not hold).
    verified: u32,
    /// Shards unverified, likewise.
    unverified: u32,
}

#[derive(Deserialize)]
struct SavedJob {
    job: JobId,
    spec: Option<JobSpec>,
    shards: Vec<SavedShard>,
    #[serde(default)]
    manifest: Option<SavedCounts>,
    #[serde(default)]
    makers: Vec<Provenance>,
    #[serde(default)]
    rejected: u32,
    #[serde(default)]
    disagreements: u32,
    #[serde(default)]
    verified: u32,
    #[serde(default)]
    unverified: u32,
}

/// The tracker's state as a checkpoint saves it, borrowed; jobs sorted by
/// id, so that equal states save to equal bytes. Its layout is that of
/// [`SavedTracker`].
#[derive(Serialize)]
pub struct SavedTrackerRef<'a> {
    pub(crate) jobs: Vec<SavedJobRef<'a>>,
    pub(crate) pending_dead: &'a [PendingDead],
    /// Strikes per machine: the (job, shard) of each result outvoted.
    pub(crate) strikes: &'a strikes::Strikes,
    /// The jobs closed (manifest written, detail dropped), oldest first.
    pub(crate) closed: Vec<&'a JobId>,
}

/// The tracker's state as a checkpoint holds it; see [`Tracker::restore`].
#[derive(Deserialize)]
pub struct SavedTracker {
    jobs: Vec<SavedJob>,
    pending_dead: Vec<PendingDead>,
    #[serde(default)]
    strikes: strikes::Strikes,
    #[serde(default)]
    closed: Vec<JobId>,
}

#[cfg(test)]
impl SavedTracker {
    /// Forgets every manifest written, as if the store had refused them.
    pub(crate) fn forget_manifests(&mut self) {
        for j in &mut self.jobs {
            j.manifest = None;
        }
    }
}

/// Why a checkpoint's state cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The tracker's part names a job twice.
    #[error("the saved tracker holds job {0} twice")]
    DuplicateJob(JobId),
    /// A job's shard appears twice.
    #[error("the saved tracker holds shard {1} of job {0} twice")]
    DuplicateShard(JobId, u32),
    /// The view's part is inconsistent.
    #[error(transparent)]
    View(#[from] crate::view::job_progress::DuplicateJob),
}

/// Follows shard events for every job.
pub struct Tracker {
    jobs: HashMap<JobId, JobTrack>,
    /// Where dead letters go (None: nowhere, they stay pending; tests).
    js: Option<jetstream::Context>,
    store: std::sync::Arc<dyn ObjectStore>,
    view: std::sync::Arc<View>,
    /// What folded events asked for and could not be done yet, tried
    /// again each tick ([`retry`]).
    retries: Retries,
    /// Why the view missed an event because the store failed, if it did: a
    /// checkpoint would keep that gap, so none is written until a restart
    /// folds those events again.
    lossy: Option<String>,
    /// Who judges results here (None: offline, tests).
    judge: Option<Judge>,
    /// Checks of done events running now (at most [`MAX_CHECKS`]), so that
    /// a slow store delays no other event: each resolves to its event and
    /// what the store said; see [`Tracker::next_check`].
    checking: tokio::task::JoinSet<CheckResult>,
    /// Done events waiting for a free check.
    queued_checks: VecDeque<ShardEvent>,
    /// Whether workers' done events are checked against their outputs
    /// (always, but in tests of other things).
    check_outputs: bool,
    /// Check rounds being judged now (each reads up to three outputs).
    judging: tokio::task::JoinSet<JudgeResult>,
    /// Strikes per machine: the (job, shard) of each of its results that a
    /// majority outvoted.
    strikes: strikes::Strikes,
    /// Machines this watchdog quarantined, with the strikes then: a result
    /// one of them finishes afterwards (a shard it ran while it learnt of
    /// its quarantine) is withdrawn as well, unless it was released.
    quarantined: BTreeMap<String, u32>,
    /// Jobs closed here: their manifest is written and their detail left
    /// memory ([`closed`]).
    closed: Closed,
}

/// Output checks run at once, at most.
const MAX_CHECKS: usize = 32;

/// A finished output check: the done event and what the store said.
pub type CheckResult = (ShardEvent, Result<Backing, BackingError>);

/// A finished output check or judgement.
pub enum Finished {
    /// An output check.
    Check(CheckResult),
    /// A judgement of a check run.
    Judgement(JudgeResult),
}

/// What the tracker needs to act on a rejected result: its own name (the
/// sender of rejection events) and how job consumers are made (a rejected
/// shard is queued again, and a job's consumer may be gone by then).
#[derive(Debug, Clone)]
pub struct Judge {
    /// This watchdog's name.
    pub name: WorkerId,
    /// The work queue's settings.
    pub work: streams::WorkSettings,
    /// Whether workers' done events are checked against their outputs
    /// (off only for benchmarks of the watchdog on synthetic events).
    pub check: bool,
    /// The fleet's share of shards checked by a second machine, parts per
    /// million, for jobs that do not set theirs.
    pub verify_ppm: u32,
    /// The secret that picks which shards are checked (shared by the
    /// fleet's watchdogs, never by workers).
    pub verify_key: Vec<u8>,
    /// Strikes (results outvoted) that quarantine a machine.
    pub quarantine_after: u32,
    /// How long a strike counts, ms.
    pub strikes_expire_ms: u64,
    /// How long a check round waits for a machine to run it before the
    /// check closes `undecided` and the shard's result stands unverified, ms.
    pub checks_wait_ms: u64,
    /// The quarantine bucket (None: machines are never quarantined).
    pub quarantine: Option<jetstream::kv::Store>,
    /// Finished jobs whose summary is kept (the newest; older ones are
    /// answered by their manifests).
    pub finished_kept: usize,
}

/// What reading a job's spec found.
enum SpecRead {
    /// The spec.
    Found(Box<JobSpec>),
    /// There is none, or it is unreadable for good (too large, malformed).
    Missing,
    /// The store failed; another read may succeed.
    Failed(String),
}

impl Tracker {
    /// A tracker that writes records through `js` and manifests to `store`,
    /// and keeps every job's progress in `view`.
    pub fn new(
        js: jetstream::Context,
        store: std::sync::Arc<dyn ObjectStore>,
        view: std::sync::Arc<View>,
        judge: Judge,
    ) -> Self {
        let mut t = Self::empty(store, view);
        t.closed = Closed::new(judge.finished_kept);
        t.js = Some(js);
        t.check_outputs = judge.check;
        t.judge = Some(judge);
        t
    }

    fn empty(store: std::sync::Arc<dyn ObjectStore>, view: std::sync::Arc<View>) -> Self {
        Self {
            jobs: HashMap::new(),
            js: None,
            store,
            view,
            retries: Retries::default(),
            lossy: None,
            judge: None,
            checking: tokio::task::JoinSet::new(),
            queued_checks: VecDeque::new(),
            check_outputs: false,
            judging: tokio::task::JoinSet::new(),
            strikes: strikes::Strikes::default(),
            quarantined: BTreeMap::new(),
            closed: Closed::new(DEFAULT_FINISHED_KEPT),
        }
    }

    /// A tracker without NATS, for benchmarks of the fold itself: dead
    /// letters are only kept pending, done events count unchecked, check
    /// runs are never queued; manifests are written to `store`, and the
    /// newest `finished_kept` closed jobs are remembered.
    pub fn standalone(
        store: std::sync::Arc<dyn ObjectStore>,
        view: std::sync::Arc<View>,
        finished_kept: usize,
    ) -> Self {
        let mut t = Self::empty(store, view);
        t.closed = Closed::new(finished_kept);
        t
    }

    /// A tracker without NATS: dead letters are never written, only kept
    /// pending; done events are counted unchecked (see
    /// [`Tracker::checking`]).
    #[cfg(test)]
    pub(crate) fn offline(
        store: std::sync::Arc<dyn ObjectStore>,
        view: std::sync::Arc<View>,
    ) -> Self {
        Self::empty(store, view)
    }

    /// An offline tracker that checks done events against their outputs
    /// (rejections cannot be published: they wait as pending checks).
    #[cfg(test)]
    pub(crate) fn checking(mut self) -> Self {
        self.check_outputs = true;
        self
    }

    /// A copy of what a checkpoint saves of the tracker (open jobs'
    /// detail, records waiting to be written, strikes, closed jobs), so
    /// that encoding it holds nothing the fold needs.
    pub fn copy(&self) -> TrackerCopy {
        TrackerCopy {
            jobs: self
                .jobs
                .iter()
                .map(|(j, t)| (j.clone(), t.clone()))
                .collect(),
            pending_dead: self.retries.dead_letters(),
            strikes: self.strikes.clone(),
            closed: self.closed.ids().cloned().collect(),
        }
    }

    /// The state, in its saved form (the view's jobs are saved beside
    /// it, see [`crate::checkpoint`]).
    #[cfg(test)]
    pub(crate) fn saved(&self) -> TrackerCopy {
        self.copy()
    }
}

/// What a checkpoint saves of a [`Tracker`], copied out of it
/// ([`Tracker::copy`]).
pub struct TrackerCopy {
    jobs: Vec<(JobId, JobTrack)>,
    pub(crate) pending_dead: Vec<PendingDead>,
    strikes: strikes::Strikes,
    closed: Vec<JobId>,
}

impl TrackerCopy {
    /// Open jobs held.
    #[cfg(test)]
    pub(crate) fn open_jobs(&self) -> usize {
        self.jobs.len()
    }

    /// Borrowed in its saved form; jobs sorted by id, so that equal states
    /// save to equal bytes.
    pub fn saved(&self) -> SavedTrackerRef<'_> {
        let mut jobs: Vec<SavedJobRef<'_>> = self
            .jobs
            .iter()
            .map(|(job, t)| SavedJobRef {
                job,
                spec: &t.spec,
                shards: SavedShardsRef(&t.shards),
                manifest: t
                    .manifest
                    .map(|(done, failed)| SavedCounts { done, failed }),
                makers: &t.makers,
                rejected: t.tally.rejected,
                disagreements: t.tally.disagreements,
                verified: t.tally.verified,
                unverified: t.tally.unverified,
            })
            .collect();
        jobs.sort_by(|a, b| a.job.cmp(b.job));
        SavedTrackerRef {
            jobs,
            pending_dead: &self.pending_dead,
            strikes: &self.strikes,
            closed: self.closed.iter().collect(),
        }
    }
}

impl Tracker {
    /// The view this tracker folds into.
    pub fn view(&self) -> &std::sync::Arc<View> {
        &self.view
    }

    /// Replaces the state with a checkpoint's (tracker and view's jobs);
    /// counts are derived again from the shards. On error nothing changes.
    pub fn restore(
        &mut self,
        tracker: SavedTracker,
        view: crate::view::job_progress::SavedJobs,
    ) -> Result<(), RestoreError> {
        let mut jobs = HashMap::with_capacity(tracker.jobs.len());
        for j in tracker.jobs {
            let makers = j.makers.len();
            let manifest = j.manifest.map(|c| (c.done, c.failed));
            let mut t = JobTrack {
                spec: j.spec,
                sealed: manifest.map(|_| true),
                manifest,
                makers: j.makers,
                ..Default::default()
            };
            for saved in j.shards {
                let shard = saved.shard;
                let s = ShardTrack {
                    fold: saved.fold,
                    done: saved.done,
                    hosts: saved.hosts,
                    maker: saved.maker.filter(|&m| (m as usize) < makers),
                    check: saved.check,
                };
                t.tally.shard(
                    minions_schemas::progress::Counts::default(),
                    s.fold.counts(),
                );
                if t.shards.insert(shard, s).is_some() {
                    return Err(RestoreError::DuplicateShard(j.job, shard));
                }
            }
            t.tally.rejected = j.rejected;
            t.tally.disagreements = j.disagreements;
            t.tally.verified = t.tally.verified.max(j.verified);
            t.tally.unverified = t.tally.unverified.max(j.unverified);
            if jobs.insert(j.job.clone(), t).is_some() {
                return Err(RestoreError::DuplicateJob(j.job));
            }
        }
        let view = crate::view::job_progress::JobsView::restore(view)?;
        // Jobs closed before the checkpoint count as complete before this
        // watchdog looked, as written manifests did.
        let mut closed = Closed::new(self.closed.keep());
        for job in tracker.closed {
            closed.insert(job, true);
        }
        self.closed = closed;
        self.jobs = jobs;
        self.retries = Retries::restored(tracker.pending_dead);
        self.strikes = tracker.strikes;
        *self.view.jobs() = view;
        Ok(())
    }

    /// Whether a checkpoint of the state may be written now: not after the
    /// view missed an event because the store failed (the reason is given).
    /// Also not while workers' done events wait for their check.
    pub fn lossy(&self) -> Option<String> {
        if let Some(why) = &self.lossy {
            return Some(why.clone());
        }
        let (checks, judgements) = self.retries.unfinished();
        let waiting = checks + self.checking.len() + self.queued_checks.len();
        if waiting > 0 {
            return Some(format!(
                "{waiting} done events wait for the check of their output"
            ));
        }
        let judging = self.judging.len() + judgements;
        (judging > 0).then(|| format!("{judging} check rounds or quarantines wait to be acted on"))
    }

    /// Does what folded events asked for and is not done yet: dead-letter
    /// records that could not be written and manifests of complete jobs
    /// not written. Called after restoring a checkpoint and before each
    /// checkpoint is written.
    pub async fn resume(&mut self) {
        self.drain_checks().await;
        self.retry(true).await;
        self.drain_checks().await;
        self.drain_judgements().await;
        let unwritten: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, t)| t.settled() && t.manifest != Some(t.outcome()))
            .map(|(job, _)| job.clone())
            .collect();
        for job in unwritten {
            self.maybe_complete(&job).await;
        }
        // Written before something about them waited: closed now.
        let open: Vec<JobId> = self.jobs.keys().cloned().collect();
        for job in &open {
            self.maybe_close(job);
        }
        let cancelled = self.view.jobs().cancelled_idle();
        for job in cancelled {
            self.close_cancelled(&job);
        }
    }

    /// Marks cancelled the jobs whose cancellation marker is in the store
    /// though the view does not know it (cancelled while no watchdog
    /// listened): called after restoring a checkpoint.
    pub async fn recheck_cancellations(&self) {
        let open = self.view.jobs().open_uncancelled();
        for job in open {
            let marker = StorePath::from(keys::job_cancelled(&job));
            if self.store.head(&marker).await.is_ok() {
                self.view.jobs().cancel(&job);
            }
        }
    }

    /// Marks a job cancelled in the view.
    pub fn cancelled(&self, job: &JobId) {
        self.view.jobs().cancel(job);
    }

    /// Applies one event; writes what it completes.
    pub async fn apply(&mut self, e: ShardEvent) {
        if !self.admit(&e).await {
            return;
        }
        self.show(&e).await;
        if matches!(e.kind, EventKind::Submitted { .. }) {
            return;
        }
        self.count(e).await;
    }

    /// The tick's work: forgets expired strikes, closes check rounds that
    /// waited too long, and tries again what waits in the retry queue (the
    /// `retry` module), oldest first; what fails again goes back. Dead-letter
    /// records are tried only with `dead_letters` (before a checkpoint, see
    /// [`Tracker::resume`]): a write that fails has already retried for a
    /// minute, and a failure that lasts would be tried and logged every
    /// tick.
    ///
    /// The first output check waiting is tried here and now: when it waits
    /// again, so do the others (the store or NATS still failing would fail
    /// them too); else they go to the running checks.
    pub async fn retry(&mut self, dead_letters: bool) {
        self.expire_strikes();
        self.give_up_checks().await;
        // None: no output check tried yet; Some(passed).
        let mut first_check: Option<bool> = None;
        for r in self.retries.take() {
            match r {
                Retry::DeadLetter(p) if dead_letters => self.write_dead_letter(p).await,
                Retry::DeadLetter(p) => self.retries.push(Retry::DeadLetter(p)),
                Retry::CheckOutput(e) => match first_check {
                    None => {
                        let r = check_done(self.store.clone(), e).await;
                        self.checked(r).await;
                        first_check = Some(!self.retries.checks_wait());
                    }
                    Some(true) => self.count(e).await,
                    Some(false) => self.retries.push(Retry::CheckOutput(e)),
                },
                Retry::Judge(e) => self.maybe_judge(&e).await,
                Retry::QueueRound {
                    job,
                    shard,
                    round,
                    avoid,
                } => self.queue_round(job, shard, round, avoid).await,
                Retry::Quarantine(m) => self.maybe_quarantine(&m, None).await,
            }
        }
    }

    /// Writes a dead-letter record; queued for a retry when it cannot be
    /// written now.
    async fn write_dead_letter(&mut self, p: PendingDead) {
        let hosts = self
            .jobs
            .get(&p.job)
            .and_then(|t| t.shards.get(&p.shard))
            .map(|s| s.hosts.clone())
            .unwrap_or_default();
        let payload = match self.spec(&p.job).await {
            SpecRead::Found(spec) => encode("shard task", &spec.task(p.shard)).ok(),
            _ => None,
        };
        if !self
            .dead_letter(&p, &hosts, payload.unwrap_or_default())
            .await
        {
            self.retries.push(Retry::DeadLetter(p));
        }
    }

    /// Whether output checks or judgements are running (then
    /// [`Tracker::next_finished`] resolves).
    pub fn checks_running(&self) -> bool {
        !self.checking.is_empty() || !self.judging.is_empty()
    }

    /// The next output check or judgement to finish (None when none runs).
    pub async fn next_finished(&mut self) -> Option<Finished> {
        loop {
            let r = tokio::select! {
                Some(r) = self.checking.join_next() => r.map(Finished::Check),
                Some(r) = self.judging.join_next() => r.map(Finished::Judgement),
                else => return None,
            };
            match r {
                Ok(f) => return Some(f),
                // Not expected (neither panics); its event is lost to this
                // watchdog until a restart folds it again.
                Err(e) => {
                    tracing::error!(error = %e, "an output check or judgement failed to run");
                    if self.lossy.is_none() {
                        self.lossy = Some(format!("a check failed to run: {e}"));
                    }
                }
            }
        }
    }

    /// Acts on what [`Tracker::next_finished`] returned.
    pub async fn finished(&mut self, f: Finished) {
        match f {
            Finished::Check(r) => self.checked(r).await,
            Finished::Judgement(r) => self.judged(r).await,
        }
    }

    /// The next output check to finish (None when none runs).
    pub async fn next_check(&mut self) -> Option<CheckResult> {
        loop {
            match self.checking.join_next().await? {
                Ok(r) => return Some(r),
                // Not expected (a check does not panic); its event is lost
                // to this watchdog until a restart folds it again.
                Err(e) => {
                    tracing::error!(error = %e, "an output check failed to run");
                    if self.lossy.is_none() {
                        self.lossy = Some(format!("an output check failed to run: {e}"));
                    }
                }
            }
        }
    }

    /// Acts on a finished output check: counts the done when its output
    /// backs it, else rejects it; one whose check failed waits for a
    /// retry. Starts queued checks in the freed places.
    pub async fn checked(&mut self, (e, r): CheckResult) {
        while self.checking.len() < MAX_CHECKS
            && let Some(q) = self.queued_checks.pop_front()
        {
            self.start_check(q);
        }
        match r {
            Ok(Backing::Backed(out)) => self.count_backed(e, Some(&out.worker)).await,
            Ok(Backing::Missing) => {
                self.reject(&e, "its output is not in the store".to_owned())
                    .await;
            }
            Ok(Backing::Mismatch(why)) => self.reject(&e, why).await,
            Err(err) => {
                tracing::warn!(job = %e.job, shard = e.shard, worker = %e.worker, error = %err,
                    "a done event's output could not be checked; it is counted once it is");
                self.retries.push(Retry::CheckOutput(e));
            }
        }
    }

    /// Finishes every running and queued output check (before a
    /// checkpoint, which must not cover events not counted yet).
    pub async fn drain_checks(&mut self) {
        while let Some(r) = self.next_check().await {
            self.checked(r).await;
        }
    }

    fn start_check(&mut self, e: ShardEvent) {
        if self.checking.len() >= MAX_CHECKS {
            self.queued_checks.push_back(e);
            return;
        }
        self.checking.spawn(check_done(self.store.clone(), e));
    }

    /// Steps one event through its shard's machine and does what that
    /// asks: a worker's result whose output must be checked first waits
    /// for the check ([`Tracker::checked`]).
    async fn count(&mut self, e: ShardEvent) {
        // Closed since it was admitted (a check finished late): its record
        // is written.
        if self.closed.contains(&e.job) {
            return;
        }
        let effects = self.jobs.entry(e.job.clone()).or_default().step(&e);
        if effects.first() == Some(&Effect::CheckOutput) {
            if self.needs_check(&e).await {
                self.start_check(e);
            } else {
                self.count_backed(e, None).await;
            }
            return;
        }
        for effect in effects {
            self.carry_out(&e, effect).await;
        }
    }

    /// Counts a worker's result whose output backs it (`made_on`: the
    /// writer its output names, when read), in the tracker and the view,
    /// and does what that asks.
    async fn count_backed(&mut self, e: ShardEvent, made_on: Option<&WorkerId>) {
        if self.closed.contains(&e.job) {
            return;
        }
        let effects = self
            .jobs
            .entry(e.job.clone())
            .or_default()
            .backed(&e, made_on);
        self.view.jobs().backed(&e);
        for effect in effects {
            self.carry_out(&e, effect).await;
        }
    }

    /// Does what a step asked for; what cannot be done now goes to the
    /// retry queue ([`retry`]). The record beside the machine is kept by
    /// the step itself ([`JobTrack::step`]).
    async fn carry_out(&mut self, e: &ShardEvent, effect: Effect) {
        match effect {
            Effect::Strike { worker } => {
                self.strike(&worker, &e.job, e.shard, e.at_ms.min(now_ms()))
                    .await;
            }
            Effect::Verify => self.maybe_verify(e).await,
            Effect::Judge => self.maybe_judge(e).await,
            Effect::DeadLetter { reason } => {
                let stream_seq = match &e.kind {
                    EventKind::Failed { stream_seq, .. } => stream_seq.unwrap_or(0),
                    _ => 0,
                };
                let p = PendingDead {
                    job: e.job.clone(),
                    shard: e.shard,
                    reason,
                    attempt: e.attempt,
                    stream_seq,
                };
                self.write_dead_letter(p).await;
            }
            Effect::MaybeComplete => self.maybe_complete(&e.job).await,
            Effect::CheckOutput | Effect::Counted | Effect::Stands { .. } | Effect::Withdrawn => {}
        }
    }

    /// Whether a worker's result that its shard's machine holds for an
    /// output check ([`Effect::CheckOutput`]) is checked
    /// ([`crate::trust::backing`]): not when this watchdog does not check
    /// outputs, nor for a job whose manifest was already written before.
    async fn needs_check(&mut self, e: &ShardEvent) -> bool {
        if !self.check_outputs || self.closed.contains(&e.job) {
            return false;
        }
        let t = self.jobs.entry(e.job.clone()).or_default();
        if t.sealed.is_none() {
            let key = StorePath::from(keys::job_manifest(&e.job));
            match self.store.head(&key).await {
                Ok(_) => t.sealed = Some(true),
                Err(object_store::Error::NotFound { .. }) => t.sealed = Some(false),
                // Looked at again with the next done; checked meanwhile.
                Err(_) => {}
            }
        }
        t.sealed != Some(true)
    }

    /// Rejects a worker's done that its output does not back: publishes a
    /// [`EventKind::Rejected`] event (one per rejected result, whichever
    /// watchdogs find it) and queues the shard again, unless its job is
    /// cancelled or the shard is done by a checked result already. What cannot be published now is retried with the
    /// pending checks.
    async fn reject(&mut self, e: &ShardEvent, why: String) {
        tracing::warn!(job = %e.job, shard = e.shard, worker = %e.worker, host = %e.host,
            attempt = e.attempt, reason = %why,
            "a done event is not backed by its output: result rejected, the shard runs again");
        if let Err(err) = self.publish_rejection(e, why).await {
            tracing::warn!(job = %e.job, shard = e.shard, error = %err,
                "a rejected result could not be published yet; will retry");
            self.retries.push(Retry::CheckOutput(e.clone()));
        }
    }

    async fn publish_rejection(&mut self, e: &ShardEvent, why: String) -> Result<(), String> {
        let (Some(js), Some(judge)) = (self.js.clone(), self.judge.clone()) else {
            return Err("no NATS connection".to_owned());
        };
        let EventKind::Done { sha256, .. } = &e.kind else {
            return Ok(());
        };
        let rejection = ShardEvent::by_watchdog(
            e.job.clone(),
            e.shard,
            judge.name.clone(),
            e.attempt,
            EventKind::Rejected {
                by: e.worker.clone(),
                sha256: sha256.clone(),
                reason: why,
            },
        );
        let bytes = encode("shard event", &rejection).map_err(|e| e.to_string())?;
        resilient::publish_once(
            &js,
            &subjects::event(&e.job, e.shard, &judge.name),
            &rejection.msg_id(),
            bytes.into(),
        )
        .await
        .map_err(|e| format!("publishing the rejection: {e}"))?;
        // Already done by a result that was checked: nothing to run again.
        if self
            .jobs
            .get(&e.job)
            .and_then(|t| t.shards.get(&e.shard))
            .is_some_and(|s| s.done.is_some())
        {
            return Ok(());
        }
        let cancelled = StorePath::from(keys::job_cancelled(&e.job));
        match self.store.head(&cancelled).await {
            Ok(_) => return Ok(()),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(err) => return Err(format!("reading the job's cancellation marker: {err}")),
        }
        let spec = match self.spec(&e.job).await {
            SpecRead::Found(spec) => spec,
            SpecRead::Missing => return Err("the job's spec is missing".to_owned()),
            SpecRead::Failed(why) => return Err(format!("reading the job's spec: {why}")),
        };
        minions_endpoints::queue::ensure_job_consumer(&js, &judge.work, &spec)
            .await
            .map_err(|e| e.to_string())?;
        let task = encode("shard task", &spec.task(e.shard)).map_err(|e| e.to_string())?;
        // The same id from every watchdog that rejects this result.
        let msg_id = format!(
            "{}/rerun/{}/{}/{}",
            subjects::msg_id(&e.job, e.shard),
            e.worker,
            e.attempt,
            e.at_ms
        );
        resilient::publish_once(&js, &subjects::work(&e.job, e.shard), &msg_id, task.into())
            .await
            .map_err(|e| format!("queueing the shard again: {e}"))?;
        Ok(())
    }

    /// Folds the event into the view, adding its job first when new.
    async fn show(&mut self, e: &ShardEvent) {
        let known = self.view.jobs().knows(&e.job);
        if !known {
            let spec = match self.spec(&e.job).await {
                SpecRead::Found(spec) => *spec,
                SpecRead::Missing => return,
                SpecRead::Failed(why) => {
                    self.missed(&e.job, why);
                    return;
                }
            };
            let model_mb = self.model_mb(&spec).await;
            let marker = StorePath::from(keys::job_cancelled(&e.job));
            let cancelled = match self.store.head(&marker).await {
                Ok(_) => true,
                Err(object_store::Error::NotFound { .. }) => false,
                Err(err) => {
                    self.missed(&e.job, err.to_string());
                    false
                }
            };
            self.view.jobs().add(spec, model_mb, cancelled);
        }
        self.view.jobs().apply(e);
    }

    /// The size of a job's model files, MB (rounded up).
    async fn model_mb(&self, spec: &JobSpec) -> Option<u64> {
        let key = StorePath::from(keys::model_manifest(&spec.model_hash));
        let got = self.store.get(&key).await.ok()?;
        if got.meta.size > limits::MAX_MANIFEST_BYTES as u64 {
            return None;
        }
        let bytes = got.bytes().await.ok()?;
        let m: ModelManifest = decode("model manifest", &bytes, limits::MAX_MANIFEST_BYTES).ok()?;
        let total: u64 = m.files.iter().map(|f| f.bytes).sum();
        Some(total.div_ceil(1024 * 1024))
    }

    /// Notes that the view missed (part of) an event of `job` because the
    /// store failed: no checkpoint is written from now on.
    fn missed(&mut self, job: &JobId, why: String) {
        if self.lossy.is_none() {
            tracing::warn!(job = %job, error = %why,
                "the store failed while a job was added to the view; no checkpoints until a restart folds its events again");
            self.lossy = Some(format!("job {job}: {why}"));
        }
    }

    /// A job's spec: kept with its track, else read from the store (and
    /// kept when the job is open here).
    async fn spec(&mut self, job: &JobId) -> SpecRead {
        if let Some(spec) = self.jobs.get(job).and_then(|t| t.spec.as_ref()) {
            return SpecRead::Found(Box::new(spec.clone()));
        }
        let key = StorePath::from(keys::job_spec(job));
        let got = match self.store.get(&key).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return SpecRead::Missing,
            Err(e) => return SpecRead::Failed(e.to_string()),
        };
        if got.meta.size > limits::MAX_SPEC_BYTES as u64 {
            return SpecRead::Missing;
        }
        let bytes = match got.bytes().await {
            Ok(b) => b,
            Err(e) => return SpecRead::Failed(e.to_string()),
        };
        match decode::<JobSpec>("job spec", &bytes, limits::MAX_SPEC_BYTES) {
            Ok(spec) => {
                if let Some(t) = self.jobs.get_mut(job) {
                    t.spec = Some(spec.clone());
                }
                SpecRead::Found(Box::new(spec))
            }
            Err(_) => SpecRead::Missing,
        }
    }

    /// Writes the dead-letter record `p` (of shard track `s`, its task
    /// `payload`); true when it is stored (now or before).
    async fn dead_letter(&self, p: &PendingDead, hosts: &[String], payload: Vec<u8>) -> bool {
        let (job, shard, attempt) = (&p.job, p.shard, p.attempt);
        let reason = p.reason.clone();
        let Some(js) = &self.js else {
            return false;
        };
        let subject = subjects::dead(job, shard);
        // Already recorded for this delivery count (a replay after restart)?
        if let Ok(stream) = js.get_stream(streams::DEAD_STREAM).await
            && let Ok(last) = stream.get_last_raw_message_by_subject(&subject).await
            && let Ok(old) = decode::<DeadLetter>(
                "dead letter",
                &last.payload,
                limits::MAX_TASK_BYTES + limits::MAX_EVENT_BYTES,
            )
            && old.deliveries == attempt
        {
            return true;
        }
        let record = DeadLetter {
            v: SCHEMA_VERSION,
            job: job.clone(),
            shard,
            payload,
            reason: reason.clone(),
            cause: if reason.starts_with("no worker finished it") {
                "max_deliveries"
            } else {
                "terminated"
            }
            .to_owned(),
            deliveries: attempt,
            hosts: hosts.to_vec(),
            stream_seq: p.stream_seq,
            at_ms: now_ms(),
        };
        let Ok(bytes) = encode("dead letter", &record) else {
            // Not caused by input, and no retry would change it.
            return true;
        };
        match resilient::publish_once(
            js,
            &subject,
            &format!("{job}/{shard}/{attempt}"),
            bytes.into(),
        )
        .await
        {
            Ok(a) => {
                if !a.duplicate {
                    tracing::warn!(job = %job, shard, deliveries = attempt, reason = %reason, hosts = ?hosts, "dead letter recorded")
                }
                true
            }
            Err(e) => {
                tracing::error!(job = %job, shard, error = %e, "dead letter not stored; will retry");
                false
            }
        }
    }

    async fn maybe_complete(&mut self, job: &JobId) {
        let Some(track) = self.jobs.get(job) else {
            return;
        };
        let (done, failed) = track.outcome();
        // Open checks may still replace a result or withdraw it.
        if track.tally.checking > 0 {
            return;
        }
        if track.manifest == Some((done, failed))
            || track
                .spec
                .as_ref()
                .is_some_and(|s| done + failed < s.shards)
        {
            return;
        }
        let SpecRead::Found(spec) = self.spec(job).await else {
            return;
        };
        let Some(track) = self.jobs.get(job) else {
            return;
        };
        if done + failed < spec.shards {
            return;
        }
        let manifest = JobManifest {
            v: SCHEMA_VERSION,
            job: job.clone(),
            model_hash: spec.model_hash.clone(),
            records: spec.records,
            done,
            failed,
            rejected: track.tally.rejected,
            verified: track.tally.verified,
            disagreements: track.tally.disagreements,
            unverified: track.tally.unverified,
            shards: (0..spec.shards)
                .map(|i| {
                    let s = track.shards.get(&i).cloned().unwrap_or_default();
                    if s.fold.is_done() {
                        ManifestShard {
                            shard: i,
                            outcome: "done".into(),
                            output_key: Some(keys::shard_output(job, i)),
                            sha256: s.done.as_ref().map(|d| d.sha256.clone()),
                            worker: s.done.as_ref().map(|d| d.worker.clone()),
                            made_by: s.maker.and_then(|m| track.makers.get(m as usize).cloned()),
                            attempts: s.fold.attempts(),
                            duration_ms: s.done.as_ref().map_or(0, |d| d.ms),
                            reason: None,
                        }
                    } else {
                        ManifestShard {
                            shard: i,
                            outcome: "failed".into(),
                            output_key: None,
                            sha256: None,
                            worker: None,
                            made_by: None,
                            attempts: s.fold.attempts(),
                            duration_ms: 0,
                            reason: s.fold.failure().map(str::to_owned),
                        }
                    }
                })
                .collect(),
            completed_ms: now_ms(),
        };
        if self.write_manifest(&manifest).await
            && let Some(t) = self.jobs.get_mut(job)
        {
            t.manifest = Some((done, failed));
            self.maybe_close(job);
        }
    }

    /// Writes the manifest as its job's next revision (create-only; see
    /// [`minions_endpoints::manifest`]) unless the newest records the same
    /// or has more shards done (a retry adds done shards; a verdict or a
    /// quarantine re-run changes which results stand). True when the
    /// store holds it, or a newer one.
    async fn write_manifest(&self, m: &JobManifest) -> bool {
        use minions_endpoints::manifest::{self, Written};
        match manifest::write(self.store.as_ref(), m).await {
            Ok(Written::New(revision)) => {
                tracing::info!(job = %m.job, done = m.done, failed = m.failed, revision,
                    "job complete; manifest written");
                true
            }
            Ok(Written::Same(_) | Written::Kept(_)) => true,
            Err(e) => {
                tracing::error!(job = %m.job, error = %e, "manifest not written");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::IdError;
    use minions_schemas::messages::EventKind;

    fn event(shard: u32, kind: EventKind) -> Result<ShardEvent, IdError> {
        Ok(ShardEvent {
            energy: None,
            v: SCHEMA_VERSION,
            job: JobId::new("j")?,
            shard,
            worker: WorkerId::new("m-1")?,
            host: "m".into(),
            attempt: 1,
            at_ms: 0,
            kind,
        })
    }

    type Res = Result<(), Box<dyn std::error::Error>>;

    /// Writes a one-dimensional output of `rows` rows for `shard` of job
    /// `j`; returns its SHA-256.
    async fn output(
        store: &dyn ObjectStore,
        shard: u32,
        rows: u64,
    ) -> Result<String, Box<dyn std::error::Error>> {
        use sha2::Digest;
        let out = minions_schemas::messages::ShardOutput {
            v: SCHEMA_VERSION,
            job: JobId::new("j")?,
            shard,
            first_row: u64::from(shard) * 10,
            rows,
            model_hash: minions_schemas::ModelHash::new("a".repeat(64))?,
            worker: WorkerId::new("m-1")?,
            payload: minions_schemas::messages::OutputPayload::Embeddings {
                dim: 1,
                data: (0..rows).flat_map(|_| 1f32.to_le_bytes()).collect(),
            },
            made_by: None,
        };
        let bytes = encode("shard output", &out)?;
        let sha = hex::encode(sha2::Sha256::digest(&bytes));
        store
            .put(
                &StorePath::from(keys::shard_output(&out.job, shard)),
                bytes.into(),
            )
            .await?;
        Ok(sha)
    }

    fn done(rows: u64, sha: &str) -> EventKind {
        EventKind::test_done(rows, sha)
    }

    /// A store holding the spec of job `j`: `shards` shards, `records`.
    async fn store_with_spec(
        shards: u32,
        records: u64,
    ) -> Result<std::sync::Arc<dyn ObjectStore>, Box<dyn std::error::Error>> {
        let store: std::sync::Arc<dyn ObjectStore> =
            std::sync::Arc::new(object_store::memory::InMemory::new());
        let spec = crate::view::job_progress::fixtures::spec("j", shards, records)?;
        store
            .put(
                &StorePath::from(keys::job_spec(&spec.job)),
                encode("job spec", &spec)?.into(),
            )
            .await?;
        Ok(store)
    }

    async fn manifest_of(
        store: &dyn ObjectStore,
    ) -> Result<JobManifest, Box<dyn std::error::Error>> {
        let got = minions_endpoints::manifest::latest(store, &JobId::new("j")?).await?;
        Ok(got.ok_or("no manifest")?.1)
    }

    #[tokio::test]
    async fn a_finished_job_leaves_memory_and_moves_again_from_its_manifest() -> Res {
        let store = store_with_spec(3, 25).await?;
        let view = std::sync::Arc::new(View::new("t".into(), crate::registry::Registry::new(3)));
        let mut t = Tracker::offline(store.clone(), view.clone());
        let job = JobId::new("j")?;
        t.apply(event(0, done(10, "s0"))?).await;
        t.apply(event(1, done(10, "s1"))?).await;
        let failed = EventKind::Failed {
            reason: "bad input".into(),
            permanent: true,
            stream_seq: None,
        };
        t.apply(event(2, failed)?).await;
        // Offline, the dead letter waits: the job stays open until it is
        // written (here: never), with its manifest written.
        assert_eq!(
            (manifest_of(store.as_ref()).await?.done, t.jobs.len()),
            (2, 1)
        );
        t.retries.clear_dead_letters();
        t.resume().await;
        // Closed: no detail left, in memory or in a checkpoint; the view
        // keeps the counts.
        assert!(t.jobs.is_empty() && t.closed.contains(&job));
        assert_eq!(t.saved().open_jobs(), 0);
        let p = view
            .jobs()
            .get(&job)
            .map(|j| (j.is_closed(), j.progress(0)));
        assert!(
            p.as_ref()
                .is_some_and(|(closed, p)| *closed && (p.done, p.failed) == (2, 1))
        );
        // A late duplicate changes nothing.
        t.apply(event(0, done(10, "s0"))?).await;
        assert!(t.jobs.is_empty());
        // A retry moves it again: reopened from the manifest, then done.
        t.apply(ShardEvent::by_cli(job.clone(), 2, EventKind::Requeued)?)
            .await;
        assert_eq!(t.jobs.get(&job).map(JobTrack::outcome), Some((2, 0)));
        t.apply(event(2, done(5, "s2"))?).await;
        let m = manifest_of(store.as_ref()).await?;
        assert_eq!((m.done, m.failed), (3, 0));
        assert!(t.jobs.is_empty() && t.closed.contains(&job));
        let p = view.jobs().get(&job).map(|j| j.progress(0).done);
        assert_eq!(p, Some(3));
        // A watchdog that replays the stream closes it at first sight,
        // counted from its manifest.
        let fresh = std::sync::Arc::new(View::new("t".into(), crate::registry::Registry::new(3)));
        let mut replay = Tracker::offline(store.clone(), fresh.clone());
        replay.apply(event(0, EventKind::Started)?).await;
        replay.apply(event(0, done(10, "s0"))?).await;
        assert!(replay.jobs.is_empty() && replay.closed.contains(&job));
        assert_eq!(fresh.jobs().counters.done, 3);
        assert_eq!(
            fresh.jobs().get(&job).map(|j| j.progress(0).records_done),
            Some(25)
        );
        // The quarantine of the machine that made its results reopens it
        // where it completed while the watchdog watched, not in the replay
        // (complete before it looked).
        replay.reopen_made_on("m").await;
        assert!(replay.jobs.is_empty());
        t.reopen_made_on("other").await;
        assert!(t.jobs.is_empty());
        t.reopen_made_on("m").await;
        assert_eq!(t.jobs.get(&job).map(JobTrack::outcome), Some((3, 0)));
        Ok(())
    }

    #[tokio::test]
    async fn a_done_counts_only_when_its_output_backs_it() -> Res {
        let store: std::sync::Arc<dyn ObjectStore> =
            std::sync::Arc::new(object_store::memory::InMemory::new());
        let spec = crate::view::job_progress::fixtures::spec("j", 2, 15)?;
        store
            .put(
                &StorePath::from(keys::job_spec(&spec.job)),
                encode("job spec", &spec)?.into(),
            )
            .await?;
        let view = std::sync::Arc::new(View::new("t".into(), crate::registry::Registry::new(3)));
        let mut t = Tracker::offline(store.clone(), view).checking();
        let sha0 = output(store.as_ref(), 0, 10).await?;
        t.apply(event(0, done(10, &sha0))?).await;
        // Forged: shard 1 has no output.
        t.apply(event(1, done(5, &"ab".repeat(32)))?).await;
        t.drain_checks().await;
        let job = JobId::new("j")?;
        let manifest = StorePath::from(keys::job_manifest(&job));
        assert_eq!(t.jobs.get(&job).map(|j| j.tally.done), Some(1));
        assert!(store.head(&manifest).await.is_err());
        // Offline, the rejection cannot be published: it waits, and no
        // checkpoint may be written meanwhile.
        assert!(t.lossy().is_some_and(|w| w.contains("1 done events")));
        // The shard runs again and its real output counts; the manifest
        // names the real result.
        let sha1 = output(store.as_ref(), 1, 5).await?;
        let mut real = event(1, done(5, &sha1))?;
        real.worker = WorkerId::new("m-2")?;
        t.apply(real).await;
        t.drain_checks().await;
        let got = store.get(&manifest).await?.bytes().await?;
        let m: JobManifest = decode("job manifest", &got, 1 << 20)?;
        assert_eq!((m.done, m.failed), (2, 0));
        assert_eq!(m.shards[1].sha256.as_deref(), Some(sha1.as_str()));
        assert_eq!(m.shards[1].worker.as_ref().map(|w| w.as_str()), Some("m-2"));
        // The forged done, checked again, is still rejected: the job's
        // manifest was written by this tracker, not found at first sight.
        t.retry(false).await;
        let s1 = t.jobs.get(&job).and_then(|j| j.shards.get(&1)).cloned();
        assert_eq!(
            s1.and_then(|s| s.done)
                .map(|d| d.worker.as_str().to_owned()),
            Some("m-2".to_owned())
        );
        assert!(t.lossy().is_some());
        Ok(())
    }

    /// A delivery that finds a shard's output already written reports it
    /// (`already_done`), but the result stays the writer's, whether the
    /// writer reported it first or not at all: a quarantine of the writer
    /// must find it.
    #[tokio::test]
    async fn a_result_is_the_writers_not_the_delivery_that_found_it_written() -> Res {
        let store: std::sync::Arc<dyn ObjectStore> =
            std::sync::Arc::new(object_store::memory::InMemory::new());
        let view = std::sync::Arc::new(View::new("t".into(), crate::registry::Registry::new(3)));
        let mut t = Tracker::offline(store.clone(), view).checking();
        let found = |shard, sha: &str| -> Result<ShardEvent, IdError> {
            let mut e = event(shard, done(10, sha))?;
            e.worker = WorkerId::new("m-2")?;
            if let EventKind::Done { already_done, .. } = &mut e.kind {
                *already_done = true;
            }
            Ok(e)
        };
        // Shard 0: the writer (m-1) stopped before it reported, only the
        // finder reports; shard 1: the writer's report, then the finder's.
        let sha0 = output(store.as_ref(), 0, 10).await?;
        t.apply(found(0, &sha0)?).await;
        t.drain_checks().await;
        let sha1 = output(store.as_ref(), 1, 10).await?;
        t.apply(event(1, done(10, &sha1))?).await;
        t.drain_checks().await;
        t.apply(found(1, &sha1)?).await;
        t.drain_checks().await;
        let job = JobId::new("j")?;
        for shard in [0, 1] {
            let by = t
                .jobs
                .get(&job)
                .and_then(|j| j.shards.get(&shard))
                .and_then(|s| s.done.clone())
                .map(|d| d.worker.as_str().to_owned());
            assert_eq!(by.as_deref(), Some("m-1"), "shard {shard}");
        }
        Ok(())
    }

    /// The step asks for its effects and does none itself: a shard that
    /// fails for good asks for one dead-letter record; a worker's result
    /// for its output check first, then (backed) for a verification pick;
    /// every event for a completion check, last.
    #[test]
    fn the_step_returns_its_effects_in_order() -> Result<(), IdError> {
        let names = |effects: Vec<Effect>| -> Vec<&'static str> {
            effects
                .into_iter()
                .map(|e| match e {
                    Effect::CheckOutput => "check output",
                    Effect::Counted => "counted",
                    Effect::Stands { .. } => "stands",
                    Effect::Withdrawn => "withdrawn",
                    Effect::Strike { .. } => "strike",
                    Effect::Verify => "verify",
                    Effect::Judge => "judge",
                    Effect::DeadLetter { .. } => "dead letter",
                    Effect::MaybeComplete => "complete",
                })
                .collect()
        };
        let failed = || EventKind::Failed {
            reason: "bad input".into(),
            permanent: true,
            stream_seq: None,
        };
        let mut t = JobTrack::default();
        assert_eq!(
            names(t.step(&event(0, failed())?)),
            ["dead letter", "complete"]
        );
        // Failed for good once: a repeat writes no second record.
        assert_eq!(names(t.step(&event(0, failed())?)), ["complete"]);
        let done = event(1, done(1, "aa"))?;
        assert_eq!(names(t.step(&done)), ["check output", "complete"]);
        assert_eq!(t.outcome(), (0, 1), "not counted before its check");
        assert_eq!(
            names(t.backed(&done, None)),
            ["counted", "verify", "complete"]
        );
        assert_eq!(
            t.shards
                .get(&1)
                .and_then(|s| s.done.as_ref())
                .map(|d| d.worker.as_str()),
            Some("m-1")
        );
        assert_eq!(names(t.step(&event(2, EventKind::Started)?)), ["complete"]);
        assert_eq!(t.outcome(), (1, 1));
        Ok(())
    }

    /// The tracker's counts, kept as events arrive, equal a recount of its
    /// shards, and the counts of the dashboard's fold of the same events:
    /// both step the same machine.
    #[test]
    fn running_counts_match_a_recount_and_the_dashboards() -> Result<(), Box<dyn std::error::Error>>
    {
        let spec = crate::view::job_progress::fixtures::spec("j", 50, 500)?;
        let mut fold = minions_schemas::progress::JobFold::new(spec.clone()).checking_outputs();
        let mut t = JobTrack {
            spec: Some(spec),
            ..JobTrack::default()
        };
        let mut seed = 7u64;
        let mut saw = (false, false);
        for i in 0..5000u64 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let shard = ((seed >> 33) % 50) as u32;
            let kind = match (seed >> 20) % 6 {
                0 => EventKind::Started,
                1 => done(1, if i % 2 == 0 { "00" } else { "11" }),
                2 => EventKind::Requeued,
                3 => EventKind::Failed {
                    reason: "x".into(),
                    permanent: true,
                    stream_seq: None,
                },
                4 => EventKind::Rejected {
                    by: WorkerId::new("w")?,
                    sha256: "00".into(),
                    reason: "r".into(),
                },
                _ => EventKind::Failed {
                    reason: "y".into(),
                    permanent: false,
                    stream_seq: None,
                },
            };
            let mut e = event(shard, kind)?;
            if matches!(e.kind, EventKind::Rejected { .. }) {
                e.host = minions_schemas::messages::WATCHDOG_HOST.into();
            }
            let effects = t.step(&e);
            fold.apply(&e);
            // Most results are backed by their output; some are not.
            if effects.first() == Some(&Effect::CheckOutput) && !(seed >> 40).is_multiple_of(4) {
                t.backed(&e, None);
                fold.backed(&e);
            }
            let done = t.shards.values().filter(|s| s.fold.is_done()).count() as u32;
            let failed = t
                .shards
                .values()
                .filter(|s| s.fold.failure().is_some())
                .count() as u32;
            assert_eq!(t.outcome(), (done, failed));
            assert_eq!(
                t.shards.values().filter(|s| s.done.is_some()).count() as u32,
                done,
                "a record beside each result counted"
            );
            let p = fold.progress(0);
            assert_eq!((p.done, p.failed), (done, failed), "after event {i}");
            assert_eq!(p.rejected, u64::from(t.tally.rejected));
            saw = (saw.0 || done > 0, saw.1 || failed > 0);
        }
        assert_eq!(saw, (true, true), "the sequence reached both outcomes");
        Ok(())
    }
}
