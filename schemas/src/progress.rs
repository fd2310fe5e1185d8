//! A job's progress, folded from its spec and its shard events. One fold
//! serves `minions status`, `minions watch` and the watchdog's dashboard, so
//! they always agree.
//!
//! Invariants: events are applied in stream order; a shard once done stays
//! done (a late duplicate delivery does not undo it); counts always add up to
//! the job's shard count.

use serde::{Deserialize, Serialize};

use crate::messages::{EventKind, JobSpec, ShardEvent};

mod closed;
pub mod shard;
pub use closed::{CLOSED_FAILED_LISTED, ClosedFold};
pub use shard::{Counts, Effect, Reports, ShardFold, Step, Tally};

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// No shard has started.
    Pending,
    /// Some shards have started or finished, some have not.
    Running,
    /// Every shard is done.
    Done,
    /// Every shard is settled and some failed for good.
    Failed,
    /// The job was cancelled.
    Cancelled,
}

impl JobState {
    /// The state as a word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the job has ended (nothing more will run).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Done | Self::Failed | Self::Cancelled)
    }
}

/// A shard that failed for good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedShard {
    /// The shard.
    pub shard: u32,
    /// Why.
    pub reason: String,
    /// Deliveries it had.
    pub attempts: u64,
}

/// A job's progress at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The job.
    pub job: String,
    /// Overall state.
    pub state: JobState,
    /// Model name.
    pub model: String,
    /// Records in the job.
    pub records: u64,
    /// Shards in the job.
    pub shards: u32,
    /// Shards done.
    pub done: u32,
    /// Shards running now.
    pub running: u32,
    /// Shards waiting.
    pub pending: u32,
    /// Shards failed for good.
    pub failed: u32,
    /// Records done.
    pub records_done: u64,
    /// Deliveries beyond the first, over all shards.
    pub redeliveries: u64,
    /// Shards handed back by their worker (owner returned, eviction, stop).
    #[serde(default)]
    pub handed_back: u64,
    /// Records per second since the first shard started.
    pub rate: f64,
    /// Seconds to finish at that rate (None before any is done).
    pub eta_secs: Option<f64>,
    /// When the job was submitted (ms since the epoch).
    #[serde(default)]
    pub created_ms: u64,
    /// Tokens generated so far (generation jobs): finished shards' tokens
    /// plus what running shards reported last.
    #[serde(default)]
    pub tokens: u64,
    /// Tokens generated per second since the first shard started.
    #[serde(default)]
    pub token_rate: f64,
    /// Seconds of audio transcribed so far (speech jobs): finished shards'
    /// plus what running shards reported last.
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub audio_secs: f64,
    /// Seconds of audio transcribed per second of wall time since the
    /// first shard started (the fleet's real-time factor, inverted: 60
    /// means an hour of audio a minute).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub audio_rate: f64,
    /// Results a watchdog rejected: `done` events not backed by their
    /// output (forged or corrupt); each such shard ran again.
    #[serde(default)]
    pub rejected: u64,
    /// Shards whose result a check run on another machine confirmed (or a
    /// majority of three decided).
    #[serde(default)]
    pub verified: u32,
    /// Shards whose check is still open (the job is not done before they
    /// close).
    #[serde(default)]
    pub verifying: u32,
    /// Check runs that disagreed with the result they checked.
    #[serde(default)]
    pub disagreements: u64,
    /// Shards picked for a check that closed without one (no other machine
    /// ran it in time, or the machines all disagreed): their result stands
    /// unverified.
    #[serde(default)]
    pub unverified: u64,
    /// What the open checks wait for, when the reader knows the fleet
    /// (`minions status`; see [`Progress::checks_waiting`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks_wait: Option<String>,
    /// Failed shards with reasons.
    pub failed_shards: Vec<FailedShard>,
    /// The team the job counts against.
    #[serde(default)]
    pub team: String,
    /// Its priority within the team.
    #[serde(default)]
    pub priority: crate::messages::Priority,
    /// Whether its shards yield to other work.
    #[serde(default)]
    pub preemptible: bool,
}

impl Progress {
    /// Share of shards done, 0..=1.
    pub fn fraction_done(&self) -> f64 {
        if self.shards == 0 {
            0.0
        } else {
            f64::from(self.done) / f64::from(self.shards)
        }
    }

    /// What the open checks wait for, given the machines of the fleet's
    /// live workers: a check runs on a machine other than the one that made
    /// the result, so a fleet of one machine never runs it (a watchdog
    /// closes it unverified after its `--checks-wait-secs`). None when no
    /// check is open, or when checks are only queued behind other work.
    pub fn checks_waiting(&self, live_machines: usize) -> Option<String> {
        if self.verifying == 0 || self.state.is_final() {
            return None;
        }
        if live_machines <= 1 {
            return Some(format!(
                "no second machine: {} checks wait for a machine other than the one that made each result; after the watchdog's --checks-wait-secs (15 minutes unless set) they close unverified and the job completes",
                self.verifying
            ));
        }
        (self.pending == 0 && self.running == 0).then(|| {
            format!(
                "{} checks are queued for machines other than the results' makers; the job completes once they are judged",
                self.verifying
            )
        })
    }
}

/// A shard as a fold holds it: the shared state machine ([`ShardFold`])
/// and what only progress needs (whether it runs, its tokens).
#[derive(Debug, Default, Clone)]
struct ShardState {
    fold: ShardFold,
    running: bool,
    /// Tokens generated: the done event's, or the running delivery's last report.
    tokens: u64,
    /// Audio transcribed, ms: likewise.
    audio_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Done,
    Failed,
    Running,
    Pending,
}

impl ShardState {
    fn class(&self) -> Class {
        if self.fold.is_done() {
            Class::Done
        } else if self.fold.failure().is_some() {
            Class::Failed
        } else if self.running {
            Class::Running
        } else {
            Class::Pending
        }
    }
}

/// Running totals beside the shards' [`Tally`], kept as events are applied
/// so that reading progress costs nothing per shard.
#[derive(Debug, Default, Clone)]
struct Totals {
    running: u32,
    records_done: u64,
    redeliveries: u64,
    tokens: u64,
    audio_ms: u64,
}

/// A job's events folded so far; apply events one by one, read
/// [`JobFold::progress`] at any time (its cost does not grow with the
/// job's size, only with its failed shards). Each shard steps the one
/// state machine ([`ShardFold`]) that the watchdog's tracker steps too.
#[derive(Debug, Clone)]
pub struct JobFold {
    spec: JobSpec,
    reports: Reports,
    shards: Vec<ShardState>,
    tally: Tally,
    totals: Totals,
    failed: std::collections::BTreeMap<u32, (String, u64)>,
    first_start: Option<u64>,
    last_done: Option<u64>,
    handed_back: u64,
    /// Counts carried from a job's record when it was reopened from it
    /// (its shards' check flags are not in the record).
    carried: Carried,
}

/// Counts a fold reopened from a record carries beside its shards'.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Carried {
    rejected: u64,
    disagreements: u64,
    unverified: u64,
}

/// A [`JobFold`] as it is saved (a watchdog checkpoint, MessagePack maps:
/// `rmp_serde::to_vec_named`; positional arrays cannot leave out fields at
/// their default): the spec and each
/// shard's state with named fields ([`SavedShard`]), so that a field added
/// later (with a default) leaves saved folds readable; the running totals
/// and the failed-shard list are derived again on loading, so a saved fold
/// cannot carry totals that disagree with its shards.
#[derive(Serialize)]
struct SavedFoldRef<'a> {
    spec: &'a JobSpec,
    checked: bool,
    shards: SavedShardsRef<'a>,
    first_start: Option<u64>,
    last_done: Option<u64>,
    handed_back: u64,
    rejected: u64,
    disagreements: u64,
    unverified: u64,
}

struct SavedShardsRef<'a>(&'a [ShardState]);

impl Serialize for SavedShardsRef<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(self.0.iter().map(|s| SavedShardRef {
            done: s.fold.is_done(),
            running: s.running,
            failed: &s.fold.failed,
            attempts: s.fold.attempts,
            tokens: s.tokens,
            audio_ms: s.audio_ms,
            done_tag: s.fold.counted.unwrap_or(0),
            verified: s.fold.verified,
            round: s.fold.round,
            judged: s.fold.judged,
            closed: s.fold.closed,
            unverified: s.fold.unverified,
            reported: s.fold.reported,
        }))
    }
}

/// The owned form of [`SavedFoldRef`].
#[derive(Deserialize)]
struct SavedFold {
    spec: JobSpec,
    #[serde(default)]
    checked: bool,
    shards: Vec<SavedShard>,
    first_start: Option<u64>,
    last_done: Option<u64>,
    handed_back: u64,
    rejected: u64,
    disagreements: u64,
    #[serde(default)]
    unverified: u64,
}

/// One shard as a saved fold holds it, borrowed (see [`SavedFoldRef`]);
/// its layout is that of [`SavedShard`], fields at their default left
/// out.
#[derive(Serialize)]
struct SavedShardRef<'a> {
    done: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    running: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    failed: &'a Option<String>,
    #[serde(skip_serializing_if = "shard::is_zero")]
    attempts: u64,
    #[serde(skip_serializing_if = "shard::is_zero")]
    tokens: u64,
    #[serde(skip_serializing_if = "shard::is_zero")]
    audio_ms: u64,
    #[serde(skip_serializing_if = "shard::is_zero")]
    done_tag: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    verified: bool,
    #[serde(skip_serializing_if = "shard::is_zero")]
    round: u8,
    #[serde(skip_serializing_if = "shard::is_zero")]
    judged: u32,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    closed: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    unverified: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reported: Option<u64>,
}

/// One shard as a saved fold holds it; a field missing takes its default.
#[derive(Deserialize)]
struct SavedShard {
    #[serde(default)]
    done: bool,
    #[serde(default)]
    running: bool,
    #[serde(default)]
    failed: Option<String>,
    #[serde(default)]
    attempts: u64,
    #[serde(default)]
    tokens: u64,
    #[serde(default)]
    audio_ms: u64,
    #[serde(default)]
    done_tag: u64,
    #[serde(default)]
    verified: bool,
    #[serde(default)]
    round: u8,
    #[serde(default)]
    judged: u32,
    #[serde(default)]
    closed: bool,
    #[serde(default)]
    unverified: bool,
    #[serde(default)]
    reported: Option<u64>,
}

impl SavedShard {
    /// The shard's state (whether its check is open follows from its
    /// rounds and verdicts, so it is not saved).
    fn state(self) -> ShardState {
        ShardState {
            fold: ShardFold {
                counted: self.done.then_some(self.done_tag),
                reported: self.reported,
                failed: self.failed,
                attempts: self.attempts,
                round: self.round,
                judged: self.judged,
                closed: self.closed,
                verified: self.verified,
                unverified: self.unverified,
            },
            running: self.running,
            tokens: self.tokens,
            audio_ms: self.audio_ms,
        }
    }
}

impl Serialize for JobFold {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let times = self.times();
        SavedFoldRef {
            spec: &self.spec,
            checked: self.reports == Reports::Checked,
            shards: SavedShardsRef(&self.shards),
            first_start: times.first_start,
            last_done: times.last_done,
            handed_back: times.handed_back,
            rejected: times.rejected,
            disagreements: times.disagreements,
            unverified: times.unverified,
        }
        .serialize(ser)
    }
}

impl<'de> Deserialize<'de> for JobFold {
    /// Refuses a fold whose shard list does not match its spec's shard
    /// count; derives the totals from the shards.
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        let saved = SavedFold::deserialize(de)?;
        let want = usize::try_from(saved.spec.shards).unwrap_or(usize::MAX);
        if saved.shards.len() != want {
            return Err(serde::de::Error::custom(format!(
                "job {} has {} shards but its saved fold holds {}",
                saved.spec.job,
                saved.spec.shards,
                saved.shards.len()
            )));
        }
        let shards: Vec<ShardState> = saved.shards.into_iter().map(SavedShard::state).collect();
        let mut fold = JobFold::from_shards(
            saved.spec,
            shards,
            Times {
                first_start: saved.first_start,
                last_done: saved.last_done,
                handed_back: saved.handed_back,
                rejected: saved.rejected,
                disagreements: saved.disagreements,
                unverified: saved.unverified,
            },
        );
        if saved.checked {
            fold.reports = Reports::Checked;
        }
        Ok(fold)
    }
}

/// What a fold keeps beside its shards: when work began and last ended,
/// and the job's counts that no shard holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Times {
    first_start: Option<u64>,
    last_done: Option<u64>,
    handed_back: u64,
    rejected: u64,
    disagreements: u64,
    /// Unverified shards beyond those the shards' flags count.
    #[serde(default)]
    unverified: u64,
}

impl JobFold {
    /// An empty fold for the job `spec` describes; a worker's result counts
    /// at once ([`Reports::Trusted`]: `status` and `watch`, which rely on a
    /// watchdog's rejection events).
    pub fn new(spec: JobSpec) -> Self {
        let n = usize::try_from(spec.shards).unwrap_or(0);
        Self {
            spec,
            reports: Reports::Trusted,
            shards: vec![ShardState::default(); n],
            tally: Tally::default(),
            totals: Totals::default(),
            failed: std::collections::BTreeMap::new(),
            first_start: None,
            last_done: None,
            handed_back: 0,
            carried: Carried::default(),
        }
    }

    /// The fold, a worker's result counting only once [`JobFold::backed`]
    /// says its output backs it (a watchdog, which checks outputs).
    pub fn checking_outputs(mut self) -> Self {
        self.reports = Reports::Checked;
        self
    }

    /// A fold of `spec` whose shards are `shards` (one per shard of the
    /// spec); the running totals and the failed-shard list are derived
    /// from them, so they always agree.
    fn from_shards(spec: JobSpec, shards: Vec<ShardState>, times: Times) -> Self {
        let mut totals = Totals::default();
        let mut tally = Tally::default();
        let mut failed = std::collections::BTreeMap::new();
        for (i, s) in (0u32..).zip(&shards) {
            totals.redeliveries = totals
                .redeliveries
                .saturating_add(s.fold.attempts.saturating_sub(1));
            totals.tokens = totals.tokens.saturating_add(s.tokens);
            totals.audio_ms = totals.audio_ms.saturating_add(s.audio_ms);
            tally.shard(Counts::default(), s.fold.counts());
            match s.class() {
                Class::Done => totals.records_done += spec.shard_rows(i),
                Class::Failed => {
                    failed.insert(
                        i,
                        (
                            s.fold.failure().unwrap_or_default().to_owned(),
                            s.fold.attempts,
                        ),
                    );
                }
                Class::Running => totals.running += 1,
                Class::Pending => {}
            }
        }
        // The saved unverified count held the flagged shards as well.
        let unverified = times.unverified.saturating_sub(u64::from(tally.unverified));
        Self {
            spec,
            reports: Reports::Trusted,
            shards,
            tally,
            totals,
            failed,
            first_start: times.first_start,
            last_done: times.last_done,
            handed_back: times.handed_back,
            carried: Carried {
                rejected: times.rejected,
                disagreements: times.disagreements,
                unverified,
            },
        }
    }

    /// What the fold keeps beside its shards.
    fn times(&self) -> Times {
        Times {
            first_start: self.first_start,
            last_done: self.last_done,
            handed_back: self.handed_back,
            rejected: self.carried.rejected + u64::from(self.tally.rejected),
            disagreements: self.carried.disagreements + u64::from(self.tally.disagreements),
            unverified: self.carried.unverified + u64::from(self.tally.unverified),
        }
    }

    /// The job's spec.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// Applies one event (events of other jobs and out-of-range shards are
    /// ignored); returns what its shard's step asks for ([`Effect`]).
    pub fn apply(&mut self, e: &ShardEvent) -> Vec<Effect> {
        let Some(s) = Self::shard_of(&self.spec, &mut self.shards, e) else {
            return Vec::new();
        };
        let was = (s.class(), s.fold.attempts, s.tokens, s.audio_ms);
        match &e.kind {
            EventKind::Started => {
                self.first_start = Some(self.first_start.map_or(e.at_ms, |t| t.min(e.at_ms)));
                if !s.fold.is_done() {
                    s.running = true;
                    s.tokens = 0;
                    s.audio_ms = 0;
                }
            }
            EventKind::Progress {
                tokens, audio_ms, ..
            } if !s.fold.is_done() => {
                s.tokens = *tokens;
                s.audio_ms = *audio_ms;
            }
            EventKind::Requeued | EventKind::Failed { .. } => s.running = false,
            EventKind::HandedBack { .. } => {
                s.running = false;
                self.handed_back += 1;
            }
            _ => {}
        }
        let step = s.fold.step(e, self.reports);
        if step.effects.contains(&Effect::Withdrawn) {
            s.running = false;
            s.tokens = 0;
            s.audio_ms = 0;
        }
        self.after(e, was, step)
    }

    /// Counts the result of the done event `e` once a check found its
    /// output backing it ([`Effect::CheckOutput`]); returns what that asks
    /// for.
    pub fn backed(&mut self, e: &ShardEvent) -> Vec<Effect> {
        let Some(s) = Self::shard_of(&self.spec, &mut self.shards, e) else {
            return Vec::new();
        };
        let was = (s.class(), s.fold.attempts, s.tokens, s.audio_ms);
        let step = s.fold.backed(e);
        self.after(e, was, step)
    }

    /// The shard `e` is about (None for another job's event or a shard
    /// out of range).
    fn shard_of<'a>(
        spec: &JobSpec,
        shards: &'a mut [ShardState],
        e: &ShardEvent,
    ) -> Option<&'a mut ShardState> {
        if e.job != spec.job {
            return None;
        }
        usize::try_from(e.shard)
            .ok()
            .and_then(|i| shards.get_mut(i))
    }

    /// Brings the totals up to date after shard `e.shard` stepped from
    /// `was` (class, attempts, tokens, audio ms); returns the step's
    /// effects.
    fn after(&mut self, e: &ShardEvent, was: (Class, u64, u64, u64), step: Step) -> Vec<Effect> {
        let Some(s) = Self::shard_of(&self.spec, &mut self.shards, e) else {
            return Vec::new();
        };
        if let EventKind::Done {
            tokens, audio_ms, ..
        } = &e.kind
            && step.before.done == 0
            && step.after.done == 1
        {
            if *tokens > 0 {
                s.tokens = *tokens;
            }
            if *audio_ms > 0 {
                s.audio_ms = *audio_ms;
            }
            s.running = false;
            self.last_done = Some(self.last_done.map_or(e.at_ms, |t| t.max(e.at_ms)));
        }
        if step.after.done == 1 {
            s.running = false;
        }
        self.tally.add(&step);
        let after = s.class();
        let t = &mut self.totals;
        t.tokens = t.tokens - was.2 + s.tokens;
        t.audio_ms = t.audio_ms - was.3 + s.audio_ms;
        t.redeliveries += s.fold.attempts.saturating_sub(1) - was.1.saturating_sub(1);
        if after == Class::Failed {
            let reason = s.fold.failure().unwrap_or_default().to_owned();
            self.failed.insert(e.shard, (reason, s.fold.attempts));
        } else if was.0 == Class::Failed {
            self.failed.remove(&e.shard);
        }
        if was.0 != after {
            let rows = self.spec.shard_rows(e.shard);
            match was.0 {
                Class::Done => t.records_done -= rows,
                Class::Running => t.running -= 1,
                Class::Failed | Class::Pending => {}
            }
            match after {
                Class::Done => t.records_done += rows,
                Class::Running => t.running += 1,
                Class::Failed | Class::Pending => {}
            }
        }
        step.effects
    }

    /// Whether `shard` is done.
    pub fn is_done(&self, shard: u32) -> bool {
        usize::try_from(shard)
            .ok()
            .and_then(|i| self.shards.get(i))
            .is_some_and(|s| s.fold.is_done())
    }

    /// Whether `shard` failed for good (and is not done).
    pub fn is_failed(&self, shard: u32) -> bool {
        usize::try_from(shard)
            .ok()
            .and_then(|i| self.shards.get(i))
            .is_some_and(|s| s.fold.failure().is_some())
    }

    /// The job's counts as its shards' state machines make them.
    pub fn tally(&self) -> Tally {
        self.tally
    }

    /// The progress now; `now_ms` is the clock.
    pub fn progress(&self, now_ms: u64) -> Progress {
        let spec = &self.spec;
        let mut p = Progress {
            job: spec.job.to_string(),
            state: JobState::Pending,
            model: spec.model_name.to_string(),
            records: spec.records,
            shards: spec.shards,
            done: self.tally.done,
            running: self.totals.running,
            pending: 0,
            failed: self.tally.failed,
            records_done: self.totals.records_done,
            redeliveries: self.totals.redeliveries,
            handed_back: self.handed_back,
            rejected: self.carried.rejected + u64::from(self.tally.rejected),
            verified: self.tally.verified,
            verifying: self.tally.checking,
            disagreements: self.carried.disagreements + u64::from(self.tally.disagreements),
            unverified: self.carried.unverified + u64::from(self.tally.unverified),
            checks_wait: None,
            rate: 0.0,
            eta_secs: None,
            created_ms: spec.created_ms,
            tokens: self.totals.tokens,
            token_rate: 0.0,
            audio_secs: self.totals.audio_ms as f64 / 1000.0,
            audio_rate: 0.0,
            team: spec.team.clone(),
            priority: spec.priority,
            preemptible: spec.preemptible,
            failed_shards: self
                .failed
                .iter()
                .map(|(&shard, (reason, attempts))| FailedShard {
                    shard,
                    reason: reason.clone(),
                    attempts: *attempts,
                })
                .collect(),
        };
        p.pending = spec.shards - p.done - p.failed - p.running;
        // A job whose every shard is done waits for its open checks: a
        // check's verdict may still replace a result.
        p.state = if p.done == spec.shards && p.verifying == 0 {
            JobState::Done
        } else if p.done + p.failed == spec.shards && p.failed > 0 && p.verifying == 0 {
            JobState::Failed
        } else if p.done + p.running + p.failed > 0 {
            JobState::Running
        } else {
            JobState::Pending
        };
        if let Some(start) = self.first_start {
            let end = if p.state == JobState::Done {
                self.last_done.unwrap_or(now_ms)
            } else {
                now_ms
            };
            let secs = (end.saturating_sub(start) as f64 / 1000.0).max(0.001);
            p.rate = p.records_done as f64 / secs;
            p.token_rate = p.tokens as f64 / secs;
            p.audio_rate = p.audio_secs / secs;
            if p.rate > 0.0 {
                let left = spec.records.saturating_sub(p.records_done) as f64;
                p.eta_secs = Some(left / p.rate);
            }
        }
        p
    }
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

/// Folds events (in stream order) into progress; `now_ms` is the clock.
pub fn fold(spec: &JobSpec, events: &[ShardEvent], now_ms: u64) -> Progress {
    let mut f = JobFold::new(spec.clone());
    for e in events {
        f.apply(e);
    }
    f.progress(now_ms)
}

/// Seconds as a short human duration: `42s`, `3m 05s`, `2h 10m`.
pub fn human_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

impl Progress {
    /// The human-readable report.
    pub fn render(&self) -> String {
        let pct = 100.0 * self.fraction_done();
        let state = match self.state {
            JobState::Failed => format!("completed with {} failed", self.failed),
            s => s.as_str().to_owned(),
        };
        let mut out = format!(
            "job {}: {state}\n  model    {}\n  team     {}, priority {}{}\n  records  {} in {} shards\n  shards   {} done, {} running, {} pending, {} failed ({pct:.1}% done)\n",
            self.job,
            self.model,
            self.team,
            self.priority,
            if self.preemptible {
                ", preemptible"
            } else {
                ""
            },
            self.records,
            self.shards,
            self.done,
            self.running,
            self.pending,
            self.failed
        );
        if self.rate > 0.0 {
            let eta = match (self.state, self.eta_secs) {
                (JobState::Running | JobState::Pending, Some(e)) => {
                    format!(", ETA {}", human_secs(e))
                }
                _ => String::new(),
            };
            out.push_str(&format!("  rate     {:.1} records/s{eta}\n", self.rate));
        }
        if self.tokens > 0 {
            out.push_str(&format!(
                "  tokens   {} generated, {:.1} tokens/s\n",
                self.tokens, self.token_rate
            ));
        }
        if self.audio_secs > 0.0 {
            out.push_str(&format!(
                "  audio    {} transcribed, {:.1}× real time\n",
                human_secs(self.audio_secs),
                self.audio_rate
            ));
        }
        if self.redeliveries > 0 || self.handed_back > 0 {
            out.push_str(&format!(
                "  retries  {} redeliveries, {} handed back\n",
                self.redeliveries, self.handed_back
            ));
        }
        if self.verified > 0 || self.verifying > 0 || self.disagreements > 0 || self.unverified > 0
        {
            out.push_str(&format!(
                "  checks   {} shards verified on a second machine, {} checking, {} disagreements\n",
                self.verified, self.verifying, self.disagreements
            ));
        }
        if let Some(why) = &self.checks_wait {
            out.push_str(&format!("  checks   {why}\n"));
        }
        if self.unverified > 0 {
            out.push_str(&format!(
                "  checks   {} shards unverified: no other machine ran their check in time (their results stand)\n",
                self.unverified
            ));
        }
        if self.state == JobState::Running && self.done + self.failed == self.shards {
            out.push_str(
                "  checks   every shard has a result; the job ends when a watchdog has queued and judged the checks it asked for\n",
            );
        }
        if self.rejected > 0 {
            out.push_str(&format!(
                "  trust    {} results rejected (done not backed by its output, or made on a quarantined machine; those shards ran again)\n",
                self.rejected
            ));
        }
        if !self.failed_shards.is_empty() {
            out.push_str("  failed shards:\n");
            for f in self.failed_shards.iter().take(20) {
                out.push_str(&format!(
                    "    shard {} after {} deliveries: {}\n",
                    f.shard, f.attempts, f.reason
                ));
            }
            if self.failed_shards.len() > 20 {
                out.push_str(&format!(
                    "    ... and {} more (--json lists all)\n",
                    self.failed_shards.len() - 20
                ));
            }
        }
        out.trim_end().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::VerdictOutcome;
    use crate::{IdError, WorkerId};

    fn spec() -> Result<JobSpec, IdError> {
        crate::messages::test_spec()
    }

    fn ev(shard: u32, attempt: u64, at_ms: u64, kind: EventKind) -> Result<ShardEvent, IdError> {
        ShardEvent::test_event(shard, attempt, at_ms, kind)
    }

    fn done() -> EventKind {
        EventKind::test_done(10, "")
    }

    fn done_sha(sha: &str) -> EventKind {
        let mut d = done();
        if let EventKind::Done { sha256, .. } = &mut d {
            *sha256 = sha.into();
        }
        d
    }

    fn rejected(sha: &str) -> Result<EventKind, IdError> {
        Ok(EventKind::Rejected {
            by: WorkerId::new("w")?,
            sha256: sha.into(),
            reason: "no output".into(),
        })
    }

    #[test]
    fn a_watchdogs_rejection_undoes_only_the_done_it_names()
    -> Result<(), Box<dyn std::error::Error>> {
        let mut fold = JobFold::new(spec()?);
        fold.apply(&ev(0, 1, 10, done_sha("forged"))?);
        fold.apply(&ev(1, 1, 10, done_sha("real"))?);
        assert_eq!(fold.progress(20).done, 2);
        // From a worker that claims to judge: ignored.
        fold.apply(&ev(0, 1, 20, rejected("forged")?)?);
        assert!(fold.is_done(0));
        let mut from_watchdog = ev(0, 1, 20, rejected("forged")?)?;
        from_watchdog.host = crate::messages::WATCHDOG_HOST.into();
        fold.apply(&from_watchdog);
        // A rejection of another result than the shard's leaves it done.
        let mut other = ev(1, 1, 20, rejected("forged")?)?;
        other.host = crate::messages::WATCHDOG_HOST.into();
        fold.apply(&other);
        let p = fold.progress(30);
        assert_eq!((p.done, p.rejected), (1, 2));
        assert!(!fold.is_done(0) && fold.is_done(1));
        assert_eq!(p.records_done, 10);
        // The shard runs again and is done by its real result; a saved and
        // loaded fold keeps what it knows.
        fold.apply(&ev(0, 1, 40, done_sha("real0"))?);
        let bytes = rmp_serde::to_vec_named(&fold)?;
        let back: JobFold = rmp_serde::from_slice(&bytes)?;
        assert_eq!(back.progress(50).done, 2);
        assert_eq!(back.progress(50).rejected, 2);
        Ok(())
    }

    #[test]
    fn an_open_check_holds_the_job_and_a_decided_verdict_replaces_the_result()
    -> Result<(), Box<dyn std::error::Error>> {
        let spec = spec()?;
        let n = spec.shards;
        let mut fold = JobFold::new(spec);
        for i in 0..n {
            fold.apply(&ev(i, 1, 10, done_sha("bad"))?);
        }
        let watchdog = |kind: EventKind| -> Result<ShardEvent, IdError> {
            let mut e = ev(0, 1, 20, kind)?;
            e.host = crate::messages::WATCHDOG_HOST.into();
            Ok(e)
        };
        let verdict = |round: u8, outcome: VerdictOutcome, stands: Option<&str>| {
            let stands = stands.map(WorkerId::new).transpose()?;
            watchdog(EventKind::Verdict {
                round,
                outcome,
                outvoted: Vec::new(),
                sha256: if stands.is_some() { "good" } else { "bad" }.into(),
                stands,
                detail: String::new(),
            })
        };
        // A check round from anyone but a watchdog changes nothing.
        let queued = EventKind::CheckQueued {
            round: 1,
            avoid: vec!["w".into()],
        };
        fold.apply(&ev(0, 1, 20, queued.clone())?);
        assert_eq!(fold.progress(30).state, JobState::Done);
        fold.apply(&watchdog(queued)?);
        let p = fold.progress(30);
        assert_eq!((p.state, p.done, p.verifying), (JobState::Running, n, 1));
        // A disagreement keeps it open; the tie-break closes it.
        fold.apply(&verdict(1, VerdictOutcome::Disagreed, None)?);
        fold.apply(&watchdog(EventKind::CheckQueued {
            round: 2,
            avoid: Vec::new(),
        })?);
        assert_eq!(fold.progress(40).verifying, 1);
        fold.apply(&verdict(2, VerdictOutcome::Decided, Some("m2-x"))?);
        let p = fold.progress(50);
        assert_eq!(
            (p.state, p.verifying, p.verified, p.disagreements),
            (JobState::Done, 0, 1, 1)
        );
        // The shard is done by the result that stands now: a rejection of
        // the replaced one leaves it done, one of the standing one does not.
        fold.apply(&watchdog(rejected("bad")?)?);
        assert!(fold.is_done(0));
        fold.apply(&watchdog(rejected("good")?)?);
        assert!(!fold.is_done(0));
        let bytes = rmp_serde::to_vec_named(&fold)?;
        let back: JobFold = rmp_serde::from_slice(&bytes)?;
        let p = back.progress(60);
        assert_eq!((p.verified, p.disagreements, p.done), (1, 1, n - 1));
        Ok(())
    }

    #[test]
    fn folds_events() -> Result<(), IdError> {
        let spec = spec()?;
        let events = vec![
            ev(0, 1, 1000, EventKind::Started)?,
            ev(0, 1, 2000, done())?,
            ev(1, 1, 1000, EventKind::Started)?,
            ev(
                1,
                1,
                1500,
                EventKind::Failed {
                    reason: "net".into(),
                    permanent: false,
                    stream_seq: None,
                },
            )?,
            ev(1, 2, 1600, EventKind::Started)?,
            ev(
                2,
                3,
                1700,
                EventKind::Failed {
                    reason: "bad input".into(),
                    permanent: true,
                    stream_seq: None,
                },
            )?,
        ];
        let p = fold(&spec, &events, 3000);
        assert_eq!((p.done, p.running, p.pending, p.failed), (1, 1, 1, 1));
        assert_eq!(p.state, JobState::Running);
        assert_eq!(p.records_done, 10);
        assert_eq!(p.redeliveries, 1 + 2);
        assert!((p.rate - 5.0).abs() < 1e-9, "{}", p.rate);
        assert_eq!(p.failed_shards[0].reason, "bad input");
        assert!(p.render().contains("1 failed"));
        Ok(())
    }

    #[test]
    fn a_done_shard_stays_done_after_a_late_duplicate() -> Result<(), IdError> {
        let spec = spec()?;
        let mut events = Vec::new();
        for s in 0..4 {
            events.push(ev(s, 1, 1000, done())?);
        }
        events.push(ev(2, 2, 1100, EventKind::Started)?);
        let p = fold(&spec, &events, 5000);
        assert_eq!(p.state, JobState::Done);
        assert_eq!(p.records_done, 35);
        let failed = fold(
            &spec,
            &[
                ev(
                    0,
                    5,
                    1,
                    EventKind::Failed {
                        reason: "x".into(),
                        permanent: true,
                        stream_seq: None,
                    },
                )?,
                ev(1, 1, 1, done())?,
                ev(2, 1, 1, done())?,
                ev(3, 1, 1, done())?,
            ],
            10,
        );
        assert_eq!(failed.state, JobState::Failed);
        assert!(failed.render().contains("completed with 1 failed"));
        Ok(())
    }

    #[test]
    fn a_saved_fold_loads_with_the_same_progress() -> Result<(), Box<dyn std::error::Error>> {
        let spec = spec()?;
        let mut f = JobFold::new(spec.clone());
        for e in [
            ev(0, 1, 1000, EventKind::Started)?,
            ev(0, 1, 2000, done())?,
            ev(1, 2, 1500, EventKind::Started)?,
            ev(
                2,
                3,
                1700,
                EventKind::Failed {
                    reason: "bad input".into(),
                    permanent: true,
                    stream_seq: None,
                },
            )?,
        ] {
            f.apply(&e);
        }
        let bytes = rmp_serde::to_vec_named(&f)?;
        let g: JobFold = rmp_serde::from_slice(&bytes)?;
        assert_eq!(g.progress(3000), f.progress(3000));
        assert_eq!(rmp_serde::to_vec_named(&g)?, bytes);
        // A fold whose shards do not match its spec is refused.
        let mut short = spec;
        short.shards = 3;
        let mut h = JobFold::new(short);
        h.shards.push(ShardState::default());
        let err = rmp_serde::from_slice::<JobFold>(&rmp_serde::to_vec_named(&h)?).err();
        assert!(err.is_some_and(|e| {
            e.to_string()
                .contains("has 3 shards but its saved fold holds 4")
        }));
        Ok(())
    }

    /// Saved shards are maps of named fields: one saved without a field
    /// (by an older build) loads with its default, and one with a field
    /// this build does not know (a newer build's) loads without it.
    #[test]
    fn a_saved_shard_reads_across_added_fields() -> Result<(), Box<dyn std::error::Error>> {
        #[derive(Serialize)]
        struct Other {
            done: bool,
            attempts: u64,
            from_the_future: u8,
        }
        let bytes = rmp_serde::to_vec_named(&Other {
            done: true,
            attempts: 2,
            from_the_future: 7,
        })?;
        let s: SavedShard = rmp_serde::from_slice(&bytes)?;
        assert!(s.done && !s.running && s.failed.is_none());
        assert_eq!((s.attempts, s.tokens, s.done_tag), (2, 0, 0));
        Ok(())
    }

    #[test]
    fn a_handed_back_shard_is_pending_again() -> Result<(), IdError> {
        let spec = spec()?;
        let events = vec![
            ev(0, 1, 1000, EventKind::Started)?,
            ev(
                0,
                1,
                1100,
                EventKind::HandedBack {
                    reason: "owner: input 0 s ago".into(),
                },
            )?,
        ];
        let p = fold(&spec, &events, 2000);
        assert_eq!((p.running, p.pending, p.handed_back), (0, 4, 1));
        assert!(p.render().contains("1 handed back"));
        Ok(())
    }

    #[test]
    fn running_totals_match_a_recount_after_any_sequence() -> Result<(), IdError> {
        let spec = spec()?;
        let mut f = JobFold::new(spec.clone());
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..5000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let shard = (x % 5) as u32;
            let attempt = 1 + (x >> 8) % 4;
            let kind = match (x >> 16) % 6 {
                0 => EventKind::Started,
                1 => done(),
                2 => EventKind::Requeued,
                3 => EventKind::HandedBack {
                    reason: "owner".into(),
                },
                4 => EventKind::Failed {
                    reason: "t".into(),
                    permanent: false,
                    stream_seq: None,
                },
                _ => EventKind::Failed {
                    reason: format!("p{step}"),
                    permanent: true,
                    stream_seq: None,
                },
            };
            f.apply(&ev(shard, attempt, step, kind)?);
            let p = f.progress(step);
            let (mut done, mut failed, mut running, mut records, mut redel) = (0, 0, 0, 0, 0);
            for (i, s) in (0u32..).zip(&f.shards) {
                redel += s.fold.attempts.saturating_sub(1);
                match s.class() {
                    Class::Done => {
                        done += 1;
                        records += spec.shard_rows(i);
                    }
                    Class::Failed => failed += 1,
                    Class::Running => running += 1,
                    Class::Pending => {}
                }
            }
            assert_eq!(
                (p.done, p.failed, p.running, p.records_done, p.redeliveries),
                (done, failed, running, records, redel),
                "after step {step}"
            );
            assert_eq!(p.failed_shards.len() as u32, failed);
            assert_eq!(p.done + p.failed + p.running + p.pending, spec.shards);
        }
        Ok(())
    }
}
