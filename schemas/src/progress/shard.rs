//! One shard's state machine: which result counts as its output, whether
//! it failed for good, and where its check by other machines stands. It is
//! a pure function of the state and one event that returns the typed
//! [`Effect`]s the event asks for. Every reader of a job's shards steps it:
//! the watchdog's tracker (which writes the manifest, from the effects),
//! the dashboard's fold and `minions status`/`watch` ([`super::JobFold`]),
//! so that they follow the same rules and agree on every count.
//!
//! Rules: a result counts once its output backs it ([`Reports::Checked`]:
//! a worker's result waits in [`ShardFold::reported`] until
//! [`ShardFold::backed`]; [`Reports::Trusted`]: at once, for readers that
//! cannot check and rely on the watchdog's rejections); the last result
//! counted stands, except a report of an output found already written,
//! which does not move a result already counted for it; a watchdog's
//! rejection withdraws the result it names and only that one; a verdict
//! is counted once per round, and the result it says stands replaces the
//! one counted; a shard fails for good only when no result counts.

use serde::{Deserialize, Serialize};

use crate::WorkerId;
use crate::messages::{EventKind, ShardEvent, VerdictOutcome};

/// How a fold treats a worker's reported result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reports {
    /// It counts at once (a reader that cannot check outputs; the
    /// watchdog's rejection event withdraws a result it finds unbacked).
    #[default]
    Trusted,
    /// It waits for [`ShardFold::backed`] after an output check
    /// ([`Effect::CheckOutput`]).
    Checked,
}

/// What one event asks of whoever keeps the shard's record, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// A worker reported a result that does not count yet: check its
    /// output, then call [`ShardFold::backed`] (or reject it).
    CheckOutput,
    /// The event's result now counts as the shard's output: record who
    /// made it.
    Counted,
    /// The result a verdict says stands replaces the counted one: it was
    /// made by `worker` (its SHA-256 is the verdict's).
    Stands {
        /// The maker of the standing result.
        worker: WorkerId,
    },
    /// The counted result was withdrawn (a watchdog rejected it): the
    /// shard runs again.
    Withdrawn,
    /// A worker's result was counted: it may be picked for a check.
    Verify,
    /// A check run reported: judge its round.
    Judge,
    /// A new verdict outvoted this machine's result: a strike against it.
    Strike {
        /// Who made the outvoted result.
        worker: WorkerId,
    },
    /// The shard failed for good just now: record a dead letter.
    DeadLetter {
        /// Why.
        reason: String,
    },
    /// The job may be complete (always last).
    MaybeComplete,
}

/// One shard's state. Its counts ([`ShardFold::counts`]) are what a job's
/// [`Tally`] adds up. Saved as a map of named fields, those at their
/// default left out (most of an open shard's); a field missing takes its
/// default.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShardFold {
    /// The tag ([`tag`]) of the result counted as its output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) counted: Option<u64>,
    /// The tag of a worker's result waiting for its output check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reported: Option<u64>,
    /// Why it failed for good (only while no result counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) failed: Option<String>,
    /// The most deliveries any event named.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) attempts: u64,
    /// The highest check round queued (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) round: u8,
    /// Rounds judged, as bits (round r is bit r; rounds past 31 are not
    /// told apart).
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) judged: u32,
    /// Whether a verdict closed its check.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) closed: bool,
    /// Whether a check confirmed its result (or a majority decided it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) verified: bool,
    /// Whether its check closed without confirming the result.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) unverified: bool,
}

/// A shard's contribution to its job's counts (each 0 or 1).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// A result counts.
    pub done: u32,
    /// Failed for good and not done.
    pub failed: u32,
    /// Its check is open (the job waits for it).
    pub checking: u32,
    /// A check confirmed its result.
    pub verified: u32,
    /// Its check closed without confirming its result.
    pub unverified: u32,
}

/// What one step changed: the shard's counts before and after, the job's
/// event counts it adds, and its effects.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Step {
    /// The shard's counts before the event.
    pub before: Counts,
    /// Its counts after.
    pub after: Counts,
    /// A watchdog's rejection was folded.
    pub rejected: bool,
    /// A new verdict said the check runs disagreed.
    pub disagreed: bool,
    /// What the event asks for, in order.
    pub effects: Vec<Effect>,
}

/// A job's counts, kept as its shards step (reading them costs nothing
/// per shard). Invariant: equal to the sum of its shards' counts plus the
/// events counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Shards done.
    pub done: u32,
    /// Shards failed for good.
    pub failed: u32,
    /// Shards whose check is open.
    pub checking: u32,
    /// Shards whose result a check confirmed.
    pub verified: u32,
    /// Shards whose check closed without confirming the result.
    pub unverified: u32,
    /// Rejections folded.
    pub rejected: u32,
    /// Verdicts of disagreement.
    pub disagreements: u32,
}

impl Tally {
    /// Adds what a step changed.
    pub fn add(&mut self, s: &Step) {
        self.shard(s.before, s.after);
        self.rejected += u32::from(s.rejected);
        self.disagreements += u32::from(s.disagreed);
    }

    /// Moves one shard's counts from `before` to `after`.
    pub fn shard(&mut self, before: Counts, after: Counts) {
        for (t, b, a) in [
            (&mut self.done, before.done, after.done),
            (&mut self.failed, before.failed, after.failed),
            (&mut self.checking, before.checking, after.checking),
            (&mut self.verified, before.verified, after.verified),
            (&mut self.unverified, before.unverified, after.unverified),
        ] {
            *t = (*t + a).saturating_sub(b);
        }
    }
}

/// Whether a saved number is zero (left out of a saved shard).
pub(crate) fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// A 64-bit tag of a result's SHA-256 text (FNV-1a: stable across builds,
/// as saved folds need), to tell one result from another.
pub fn tag(sha256: &str) -> u64 {
    sha256.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl ShardFold {
    /// A shard done by the result `sha256` (or failed for good with
    /// `failed`), as a job's record lists it (its check, if it had one, is
    /// over).
    pub fn recorded(sha256: Option<&str>, failed: Option<String>, attempts: u64) -> Self {
        Self {
            counted: sha256.map(tag),
            failed: if sha256.is_some() { None } else { failed },
            attempts,
            ..Self::default()
        }
    }

    /// Its counts.
    pub fn counts(&self) -> Counts {
        Counts {
            done: u32::from(self.counted.is_some()),
            failed: u32::from(self.counted.is_none() && self.failed.is_some()),
            checking: u32::from(self.check_open()),
            verified: u32::from(self.verified),
            unverified: u32::from(self.unverified),
        }
    }

    /// Whether a result counts.
    pub fn is_done(&self) -> bool {
        self.counted.is_some()
    }

    /// Why it failed for good (None when it did not, or a result counts).
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref().filter(|_| self.counted.is_none())
    }

    /// Whether `sha256` is the result that counts.
    pub fn counts_result(&self, sha256: &str) -> bool {
        self.counted == Some(tag(sha256))
    }

    /// The most deliveries any event named.
    pub fn attempts(&self) -> u64 {
        self.attempts
    }

    /// The highest check round queued or judged (0: none).
    pub fn round(&self) -> u8 {
        self.round
    }

    /// Whether `round` has its verdict.
    pub fn judged(&self, round: u8) -> bool {
        self.judged & (1u32 << u32::from(round.min(31))) != 0
    }

    /// Whether a check is queued and no verdict closed it.
    pub fn check_open(&self) -> bool {
        self.round > 0 && !self.closed
    }

    /// A worker's result waits for its output check.
    pub fn reported(&self) -> bool {
        self.reported.is_some()
    }

    /// Folds one event; `reports` says whether a worker's result waits for
    /// its output check. Events a watchdog alone may send (rejections,
    /// check rounds, verdicts) change nothing when a worker sent them.
    pub fn step(&mut self, e: &ShardEvent, reports: Reports) -> Step {
        let before = self.counts();
        let mut step = Step {
            before,
            ..Step::default()
        };
        let watchdogs = matches!(
            e.kind,
            EventKind::Rejected { .. } | EventKind::CheckQueued { .. } | EventKind::Verdict { .. }
        );
        if matches!(e.kind, EventKind::Submitted { .. }) || (watchdogs && !e.from_watchdog()) {
            step.after = before;
            return step;
        }
        self.attempts = self.attempts.max(e.attempt);
        match &e.kind {
            EventKind::Done { sha256, .. } => {
                let t = tag(sha256);
                if reports == Reports::Checked && e.from_worker() && self.counted != Some(t) {
                    self.reported = Some(t);
                    step.effects.push(Effect::CheckOutput);
                } else {
                    self.count(e, &mut step.effects);
                }
            }
            EventKind::Requeued => self.failed = None,
            EventKind::Rejected { sha256, .. } => {
                step.rejected = true;
                let t = tag(sha256);
                if self.reported == Some(t) {
                    self.reported = None;
                }
                if self.counted == Some(t) {
                    self.counted = None;
                    step.effects.push(Effect::Withdrawn);
                }
            }
            EventKind::CheckQueued { round, .. } => self.round = self.round.max(*round),
            EventKind::Checked { .. } => {
                if e.from_worker() {
                    step.effects.push(Effect::Judge);
                }
            }
            EventKind::Verdict {
                round,
                outcome,
                outvoted,
                stands,
                sha256,
                ..
            } => {
                if !self.judged(*round) {
                    self.judged |= 1u32 << u32::from((*round).min(31));
                    self.round = self.round.max(*round);
                    match outcome {
                        VerdictOutcome::Agreed | VerdictOutcome::Decided => self.verified = true,
                        VerdictOutcome::Disagreed => step.disagreed = true,
                        VerdictOutcome::Undecided => {}
                    }
                    if outcome.closes() {
                        self.closed = true;
                        self.unverified = !self.verified;
                    }
                    step.effects.extend(
                        outvoted
                            .iter()
                            .map(|w| Effect::Strike { worker: w.clone() }),
                    );
                    if let Some(w) = stands
                        && self.counted.is_some()
                    {
                        self.counted = Some(tag(sha256));
                        step.effects.push(Effect::Stands { worker: w.clone() });
                    }
                }
            }
            EventKind::Failed {
                reason, permanent, ..
            } => {
                if *permanent && self.counted.is_none() && self.failed.is_none() {
                    self.failed = Some(reason.clone());
                    step.effects.push(Effect::DeadLetter {
                        reason: reason.clone(),
                    });
                }
            }
            EventKind::Started
            | EventKind::Progress { .. }
            | EventKind::HandedBack { .. }
            | EventKind::Submitted { .. } => {}
        }
        step.after = self.counts();
        step.effects.push(Effect::MaybeComplete);
        step
    }

    /// Counts the result of the done event `e`, whose output a check found
    /// backing it (after [`Effect::CheckOutput`]).
    pub fn backed(&mut self, e: &ShardEvent) -> Step {
        let before = self.counts();
        let mut step = Step {
            before,
            ..Step::default()
        };
        if matches!(e.kind, EventKind::Done { .. }) {
            self.attempts = self.attempts.max(e.attempt);
            self.count(e, &mut step.effects);
        }
        step.after = self.counts();
        step.effects.push(Effect::MaybeComplete);
        step
    }

    /// Counts a done event's result (see the module's rules).
    fn count(&mut self, e: &ShardEvent, effects: &mut Vec<Effect>) {
        let EventKind::Done {
            sha256,
            already_done,
            ..
        } = &e.kind
        else {
            return;
        };
        let t = tag(sha256);
        if self.reported == Some(t) {
            self.reported = None;
        }
        if !(*already_done && self.counted == Some(t)) {
            self.counted = Some(t);
            effects.push(Effect::Counted);
        }
        self.failed = None;
        effects.push(Effect::Verify);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IdError;
    use crate::messages::WATCHDOG_HOST;

    fn ev(attempt: u64, kind: EventKind, watchdog: bool) -> Result<ShardEvent, IdError> {
        let mut e = ShardEvent::test_event(0, attempt, 1, kind)?;
        if watchdog {
            e.host = WATCHDOG_HOST.into();
        }
        Ok(e)
    }

    fn done(sha: &str) -> EventKind {
        EventKind::test_done(1, sha)
    }

    fn rejected(sha: &str) -> Result<EventKind, IdError> {
        Ok(EventKind::Rejected {
            by: WorkerId::new("w")?,
            sha256: sha.into(),
            reason: "bad".into(),
        })
    }

    #[test]
    fn a_checked_result_counts_only_once_backed() -> Result<(), IdError> {
        let mut s = ShardFold::default();
        let e = ev(1, done("aa"), false)?;
        let step = s.step(&e, Reports::Checked);
        assert_eq!(
            step.effects,
            vec![Effect::CheckOutput, Effect::MaybeComplete]
        );
        assert!(!s.is_done() && s.reported());
        let step = s.backed(&e);
        assert_eq!(step.after.done, 1);
        assert_eq!(
            step.effects,
            vec![Effect::Counted, Effect::Verify, Effect::MaybeComplete]
        );
        // The same result again counts at once, and moves nothing.
        let step = s.step(&e, Reports::Checked);
        assert_eq!(step.effects[0], Effect::Counted);
        assert_eq!(step.before, step.after);
        Ok(())
    }

    #[test]
    fn a_rejection_withdraws_only_the_result_it_names() -> Result<(), IdError> {
        let mut s = ShardFold::default();
        s.step(&ev(1, done("aa"), false)?, Reports::Trusted);
        s.step(&ev(2, done("bb"), false)?, Reports::Trusted);
        // The last result counted stands: rejecting the first moves nothing.
        let step = s.step(&ev(2, rejected("aa")?, true)?, Reports::Trusted);
        assert!(step.rejected && s.is_done());
        let step = s.step(&ev(2, rejected("bb")?, true)?, Reports::Trusted);
        assert_eq!(step.effects[0], Effect::Withdrawn);
        assert_eq!((step.before.done, step.after.done), (1, 0));
        // A worker cannot reject.
        s.step(&ev(3, done("cc"), false)?, Reports::Trusted);
        let step = s.step(&ev(3, rejected("cc")?, false)?, Reports::Trusted);
        assert!(!step.rejected && s.is_done());
        Ok(())
    }

    #[test]
    fn a_verdict_counts_once_per_round() -> Result<(), IdError> {
        let mut s = ShardFold::default();
        s.step(&ev(1, done("aa"), false)?, Reports::Trusted);
        let queued = EventKind::CheckQueued {
            round: 1,
            avoid: vec![],
        };
        assert_eq!(
            s.step(&ev(1, queued, true)?, Reports::Trusted)
                .after
                .checking,
            1
        );
        let verdict = EventKind::Verdict {
            round: 1,
            outcome: VerdictOutcome::Disagreed,
            outvoted: vec![WorkerId::new("w")?],
            stands: None,
            sha256: "aa".into(),
            detail: String::new(),
        };
        let first = s.step(&ev(1, verdict.clone(), true)?, Reports::Trusted);
        let again = s.step(&ev(1, verdict, true)?, Reports::Trusted);
        assert!(first.disagreed && !again.disagreed);
        assert_eq!(first.effects.len(), 2);
        assert_eq!(again.effects, vec![Effect::MaybeComplete]);
        Ok(())
    }

    #[test]
    fn a_done_shard_does_not_fail_and_a_failure_is_dead_lettered_once() -> Result<(), IdError> {
        let failed = |permanent| EventKind::Failed {
            reason: "x".into(),
            permanent,
            stream_seq: None,
        };
        let mut s = ShardFold::default();
        let step = s.step(&ev(3, failed(true), false)?, Reports::Trusted);
        assert!(matches!(step.effects[0], Effect::DeadLetter { .. }));
        let step = s.step(&ev(3, failed(true), false)?, Reports::Trusted);
        assert_eq!(step.effects, vec![Effect::MaybeComplete]);
        s.step(&ev(4, done("aa"), false)?, Reports::Trusted);
        let step = s.step(&ev(4, failed(true), false)?, Reports::Trusted);
        assert_eq!((step.after.done, step.after.failed), (1, 0));
        Ok(())
    }
}
