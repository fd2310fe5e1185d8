//! Sampled checks, the tracker's side: after a worker's `done` counts, a
//! keyed hash of the job and shard ([`crate::trust::sample`]) decides
//! whether another machine runs the shard again; the check run's `checked`
//! event is judged ([`crate::trust::judge`]); a disagreement queues a
//! tie-break round on a third machine, whose majority decides. The machine
//! that lost gets a strike; enough strikes quarantine it (a record in the
//! quarantine bucket: its workers pull nothing until an operator releases
//! it) and its results in open jobs are withdrawn and run again elsewhere.
//!
//! Every step is an event on the events stream (`check_queued`, `verdict`,
//! `rejected`) with a message id per round, so that several watchdogs, or
//! one that restarts and folds them again, take each step once; the
//! tracker folds its own steps at once as well (folding is idempotent).

use minions_endpoints::resilient;
use minions_schemas::messages::{EventKind, JobSpec, Quarantine, ShardEvent, VerdictOutcome};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, SCHEMA_VERSION, WorkerId, decode, encode, keys, limits, subjects};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use serde::{Deserialize, Serialize};

use super::retry::Retry;
use super::{SpecRead, Tracker};
use crate::trust::backing::BackingError;
use crate::trust::compare::Tolerance;
use crate::trust::judge::{self, Case, Ruling, RunResult};

/// A finished judgement: the check run's event, what was judged, and the
/// ruling (an error when the store failed: judged again later).
pub type JudgeResult = (ShardEvent, Case, Result<Ruling, BackingError>);

/// A shard's check runs beside its machine ([`minions_schemas::progress::ShardFold`],
/// which holds its rounds and verdicts): who ran it with what result, and
/// when its highest round was queued.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CheckTrack {
    /// Check runs' results.
    runs: Vec<CheckRun>,
    /// When the highest round was queued (ms since the epoch; 0: unknown).
    #[serde(default)]
    pub(super) queued_ms: u64,
}

/// One check run's result, as a [`CheckTrack`] holds and saves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CheckRun {
    /// The round it ran for.
    round: u8,
    /// Who ran it.
    worker: WorkerId,
    /// Its output's SHA-256.
    sha256: String,
    /// What made it: an index into its job's makers.
    maker: Option<u32>,
}

impl CheckTrack {
    /// Records a check run's result (once).
    pub(super) fn record(
        &mut self,
        round: u8,
        worker: &WorkerId,
        sha256: &str,
        maker: Option<u32>,
    ) {
        if !self
            .runs
            .iter()
            .any(|r| r.round == round && r.worker == *worker && r.sha256 == sha256)
        {
            self.runs.push(CheckRun {
                round,
                worker: worker.clone(),
                sha256: sha256.to_owned(),
                maker,
            });
        }
    }

    /// The maker of the check result `worker` made with `sha256`.
    pub(super) fn maker_of(&self, worker: &WorkerId, sha256: &str) -> Option<u32> {
        self.runs
            .iter()
            .find(|r| r.worker == *worker && r.sha256 == sha256)
            .and_then(|r| r.maker)
    }

    fn first_result(&self, round: u8) -> Option<RunResult> {
        self.runs
            .iter()
            .find(|r| r.round == round)
            .map(|r| RunResult {
                worker: r.worker.clone(),
                sha256: r.sha256.clone(),
            })
    }
}

/// Where a check run of `spec`'s `shard` is queued: on the job's check
/// subjects, under their own consumer (made here where missing), which
/// workers pull ahead of the job's remaining shards; on the shard's own
/// subject where the job's consumer takes all of the job's subjects (a job
/// queued before check runs had a consumer of their own).
async fn check_subject(
    js: &async_nats::jetstream::Context,
    work: &minions_schemas::streams::WorkSettings,
    spec: &JobSpec,
    shard: u32,
) -> Result<String, String> {
    let jobs = minions_endpoints::queue::ensure_job_consumer(js, work, spec)
        .await
        .map_err(|e| e.to_string())?;
    if jobs.cached_info().config.filter_subject == subjects::job_work(&spec.job) {
        return Ok(subjects::work(&spec.job, shard));
    }
    minions_endpoints::queue::ensure_check_consumer(js, work, spec)
        .await
        .map_err(|e| e.to_string())?;
    Ok(subjects::check_work(&spec.job, shard))
}

/// How close two outputs of a job's shard must be (generations compare
/// record by record, exactly, whatever this says).
fn tolerance(spec: &JobSpec) -> Tolerance {
    Tolerance::for_precision(spec.precision)
}

impl Tracker {
    /// After a worker's `done` counted: queues a check run of its shard on
    /// another machine when the shard is picked (first results only, and
    /// not in jobs complete before this watchdog looked).
    pub(super) async fn maybe_verify(&mut self, e: &ShardEvent) {
        if self.judge.is_none() || !self.check_outputs || !e.from_worker() {
            return;
        }
        let EventKind::Done { sha256, .. } = &e.kind else {
            return;
        };
        // Who made the result: the shard's record names the maker when this
        // event reports the result it holds (a delivery that found the
        // output already written is not its maker).
        let maker = self
            .jobs
            .get(&e.job)
            .and_then(|t| t.shards.get(&e.shard))
            .and_then(|s| s.done.as_ref())
            .filter(|d| d.sha256 == *sha256)
            .map_or_else(|| e.worker.clone(), |d| d.worker.clone());
        let machine = subjects::machine(&maker).to_owned();
        if let Some(&strikes) = self.quarantined.get(&machine) {
            if self.still_quarantined(&machine).await {
                let (job, sha256) = (e.job.clone(), sha256.clone());
                self.rerun_shard(&job, e.shard, maker, sha256, e.attempt, &machine, strikes)
                    .await;
                return;
            }
            self.quarantined.remove(&machine);
        }
        let Some(judge) = &self.judge else { return };
        let (ppm, key) = (judge.verify_ppm, judge.verify_key.clone());
        let Some(t) = self.jobs.get(&e.job) else {
            return;
        };
        let Some(s) = t.shards.get(&e.shard) else {
            return;
        };
        // Only the result the record holds is picked (its maker is `maker`).
        if t.sealed == Some(true)
            || s.check.is_some()
            || s.done.as_ref().map(|d| &d.sha256) != Some(sha256)
        {
            return;
        }
        let ppm = t.spec.as_ref().and_then(|s| s.verify_ppm).unwrap_or(ppm);
        let rate = f64::from(ppm) / 1e6;
        if !crate::trust::sample::picked(&key, e.job.as_str(), e.shard, rate) {
            return;
        }
        let avoid = vec![machine];
        self.queue_round(e.job.clone(), e.shard, 1, avoid).await;
    }

    /// Queues check round `round` of a shard (a `check_queued` event, then
    /// the task); what cannot be published now is retried each tick.
    pub(super) async fn queue_round(
        &mut self,
        job: JobId,
        shard: u32,
        round: u8,
        avoid: Vec<String>,
    ) {
        match self.publish_round(&job, shard, round, &avoid, None).await {
            Ok(()) => {
                tracing::info!(job = %job, shard, round, avoid = ?avoid, "check run queued");
            }
            Err(why) => {
                tracing::warn!(job = %job, shard, round, error = %why, "check run not queued yet; will retry");
                self.retries.push(Retry::QueueRound {
                    job,
                    shard,
                    round,
                    avoid,
                });
            }
        }
    }

    /// Publishes round `round`'s `check_queued` event and its task; `again`
    /// names a repeat of a round already queued (its task gets a message id
    /// of its own).
    async fn publish_round(
        &mut self,
        job: &JobId,
        shard: u32,
        round: u8,
        avoid: &[String],
        again: Option<&str>,
    ) -> Result<(), String> {
        let (Some(js), Some(judge)) = (self.js.clone(), self.judge.clone()) else {
            return Err("no NATS connection".to_owned());
        };
        let spec = match self.spec(job).await {
            SpecRead::Found(spec) => spec,
            SpecRead::Missing => return Err("the job's spec is missing".to_owned()),
            SpecRead::Failed(why) => return Err(format!("reading the job's spec: {why}")),
        };
        let subject = check_subject(&js, &judge.work, &spec, shard).await?;
        let queued = self
            .publish_event(
                job,
                shard,
                u64::from(round),
                EventKind::CheckQueued {
                    round,
                    avoid: avoid.to_vec(),
                },
            )
            .await?;
        let mut task = spec.task(shard);
        task.check = round;
        task.avoid = avoid.to_vec();
        let bytes = encode("shard task", &task).map_err(|e| e.to_string())?;
        resilient::publish_once(
            &js,
            &subject,
            &match again {
                None => format!("{}/check/{round}", subjects::msg_id(job, shard)),
                Some(a) => format!("{}/check/{round}/{a}", subjects::msg_id(job, shard)),
            },
            bytes.into(),
        )
        .await
        .map_err(|e| format!("queueing the check run: {e}"))?;
        self.fold_local(queued).await;
        Ok(())
    }

    /// Publishes an event as this watchdog; returns it.
    async fn publish_event(
        &self,
        job: &JobId,
        shard: u32,
        attempt: u64,
        kind: EventKind,
    ) -> Result<ShardEvent, String> {
        let (Some(js), Some(judge)) = (&self.js, &self.judge) else {
            return Err("no NATS connection".to_owned());
        };
        let e = ShardEvent::by_watchdog(job.clone(), shard, judge.name.clone(), attempt, kind);
        let bytes = encode("shard event", &e).map_err(|e| e.to_string())?;
        resilient::publish_once(
            js,
            &subjects::event(job, shard, &judge.name),
            &e.msg_id(),
            bytes.into(),
        )
        .await
        .map_err(|err| format!("publishing the {} event: {err}", e.kind.name()))?;
        Ok(e)
    }

    /// Folds an event this watchdog published, at once (its copy from the
    /// stream folds again as a repeat, changing nothing).
    async fn fold_local(&mut self, e: ShardEvent) {
        Box::pin(self.count(e)).await;
    }

    /// After a check run's `checked` event folded: judges its round when
    /// the check is open and the round not judged yet.
    pub(super) async fn maybe_judge(&mut self, e: &ShardEvent) {
        if !self.check_outputs || self.judge.is_none() || !e.from_worker() {
            return;
        }
        let EventKind::Checked {
            round,
            sha256,
            rows,
            ..
        } = &e.kind
        else {
            return;
        };
        let Some(t) = self.jobs.get(&e.job) else {
            return;
        };
        let Some((f, c)) = t
            .shards
            .get(&e.shard)
            .and_then(|s| Some((&s.fold, s.check.as_ref()?)))
        else {
            return;
        };
        if t.sealed == Some(true) || !f.check_open() || f.round() != *round || f.judged(*round) {
            return;
        }
        let Some(spec) = t.spec.as_ref() else {
            return;
        };
        // A check run made on a machine quarantined since (it took the run
        // before it learnt of its quarantine) does not count: the round is
        // queued again, on another machine.
        let checker = subjects::machine(&e.worker).to_owned();
        if self.view.is_quarantined(&checker)
            || (self.quarantined.contains_key(&checker) && self.still_quarantined(&checker).await)
        {
            let mut avoid: Vec<String> = t
                .shards
                .get(&e.shard)
                .and_then(|s| s.done.as_ref())
                .map(|d| subjects::machine(&d.worker).to_owned())
                .into_iter()
                .chain(
                    c.runs
                        .iter()
                        .map(|r| subjects::machine(&r.worker).to_owned()),
                )
                .collect();
            avoid.sort();
            avoid.dedup();
            let (job, shard, round) = (e.job.clone(), e.shard, *round);
            let again = format!("not-{checker}");
            match self
                .publish_round(&job, shard, round, &avoid, Some(&again))
                .await
            {
                Ok(()) => {
                    tracing::warn!(job = %job, shard, round, checker = %checker, avoid = ?avoid,
                    "a check run made on a quarantined machine does not count; queued again elsewhere")
                }
                Err(why) => {
                    tracing::warn!(job = %job, shard, round, error = %why,
                        "a check run made on a quarantined machine could not be queued again; will retry");
                    self.retries.push(Retry::Judge(e.clone()));
                }
            }
            return;
        }
        let primary = t
            .shards
            .get(&e.shard)
            .and_then(|s| s.done.as_ref())
            .map(|d| RunResult {
                worker: d.worker.clone(),
                sha256: d.sha256.clone(),
            });
        let case = Case {
            job: e.job.clone(),
            shard: e.shard,
            round: *round,
            rows: *rows,
            check: RunResult {
                worker: e.worker.clone(),
                sha256: sha256.clone(),
            },
            primary,
            earlier: if *round > 1 { c.first_result(1) } else { None },
            tolerance: tolerance(spec),
        };
        let store = self.store.clone();
        let e = e.clone();
        self.judging.spawn(async move {
            let r = judge::judge(store.as_ref(), &case).await;
            (e, case, r)
        });
    }

    /// The next judgement to finish (None when none runs).
    async fn next_judgement(&mut self) -> Option<JudgeResult> {
        loop {
            match self.judging.join_next().await? {
                Ok(r) => return Some(r),
                Err(e) => {
                    tracing::error!(error = %e, "a judgement failed to run");
                    if self.lossy.is_none() {
                        self.lossy = Some(format!("a judgement failed to run: {e}"));
                    }
                }
            }
        }
    }

    /// Finishes every running judgement (before a checkpoint).
    pub(super) async fn drain_judgements(&mut self) {
        while let Some(r) = self.next_judgement().await {
            self.judged(r).await;
        }
    }

    /// Closes, `undecided`, every open check whose round has waited longer
    /// than the fleet allows for a machine to run it (a fleet of one
    /// machine never does): the shard's result stands unverified, and the
    /// check run leaves the queue. What cannot be published now is tried
    /// again next tick.
    pub(super) async fn give_up_checks(&mut self) {
        let Some(wait_ms) = self.judge.as_ref().map(|j| j.checks_wait_ms) else {
            return;
        };
        let now = now_ms();
        let due: Vec<(JobId, u32, u8)> = self
            .jobs
            .iter()
            .filter(|(_, t)| t.tally.checking > 0 && t.sealed != Some(true))
            .flat_map(|(job, t)| {
                t.shards.iter().filter_map(move |(&shard, s)| {
                    let f = &s.fold;
                    s.check
                        .as_ref()
                        .filter(|c| {
                            f.check_open()
                                && c.queued_ms > 0
                                && c.queued_ms.saturating_add(wait_ms) <= now
                                && !f.judged(f.round())
                        })
                        .map(|_| (job.clone(), shard, f.round()))
                })
            })
            .collect();
        for (job, shard, round) in due {
            let detail = format!(
                "no machine other than those it avoids ran the check run within {} s",
                wait_ms / 1000
            );
            let verdict = self
                .publish_event(
                    &job,
                    shard,
                    u64::from(round),
                    EventKind::Verdict {
                        round,
                        outcome: VerdictOutcome::Undecided,
                        outvoted: Vec::new(),
                        stands: None,
                        sha256: String::new(),
                        detail: detail.clone(),
                    },
                )
                .await;
            match verdict {
                Ok(e) => {
                    tracing::warn!(job = %job, shard, round, detail = %detail,
                        "check closed undecided: the shard's result stands unverified");
                    self.fold_local(e).await;
                    self.withdraw_check_run(&job, shard).await;
                }
                Err(why) => {
                    tracing::warn!(job = %job, shard, round, error = %why,
                        "a check that waited too long could not be closed yet; will retry");
                }
            }
        }
    }

    /// Removes a shard's queued check run from the work stream (a check
    /// closed without it); a run already taken ends unheard.
    async fn withdraw_check_run(&self, job: &JobId, shard: u32) {
        let Some(js) = &self.js else { return };
        let purged = match js.get_stream(minions_schemas::streams::WORK_STREAM).await {
            Ok(work) => work
                .purge()
                .filter(subjects::check_work(job, shard))
                .await
                .map(|p| p.purged),
            Err(e) => {
                tracing::debug!(job = %job, shard, error = %e, "work stream not reachable");
                return;
            }
        };
        if let Err(e) = purged {
            tracing::debug!(job = %job, shard, error = %e, "check run not withdrawn");
        }
    }

    /// Acts on a finished judgement: publishes the verdict (and the
    /// tie-break round, or the replaced output) and folds it.
    pub async fn judged(&mut self, (e, case, r): JudgeResult) {
        let ruling = match r {
            Ok(r) => r,
            Err(err) => {
                tracing::warn!(job = %e.job, shard = e.shard, error = %err,
                    "a check run could not be judged; will retry");
                self.retries.push(Retry::Judge(e));
                return;
            }
        };
        if let Err(why) = self.rule(&case, ruling).await {
            tracing::warn!(job = %e.job, shard = e.shard, error = %why,
                "a check run's verdict could not be published; will retry");
            self.retries.push(Retry::Judge(e));
        }
    }

    async fn rule(&mut self, case: &Case, ruling: Ruling) -> Result<(), String> {
        let primary_sha = case
            .primary
            .as_ref()
            .map(|p| p.sha256.clone())
            .unwrap_or_default();
        let (outcome, outvoted, stands, sha256, detail) = match ruling {
            Ruling::Agreed(d) => (VerdictOutcome::Agreed, vec![], None, primary_sha, d),
            Ruling::Disagreed(d) => (VerdictOutcome::Disagreed, vec![], None, primary_sha, d),
            Ruling::Undecided(d) => (VerdictOutcome::Undecided, vec![], None, primary_sha, d),
            Ruling::Decided {
                outvoted,
                stands,
                detail,
            } => match stands {
                None => (
                    VerdictOutcome::Decided,
                    vec![outvoted],
                    None,
                    primary_sha,
                    detail,
                ),
                Some(first) => {
                    // The majority's output replaces the shard's before the
                    // verdict says so.
                    let from = StorePath::from(keys::shard_check(&case.job, case.shard, 1));
                    let to = StorePath::from(keys::shard_output(&case.job, case.shard));
                    self.store
                        .copy(&from, &to)
                        .await
                        .map_err(|e| format!("replacing the outvoted output: {e}"))?;
                    (
                        VerdictOutcome::Decided,
                        vec![outvoted],
                        Some(first.worker),
                        first.sha256,
                        detail,
                    )
                }
            },
        };
        let level_warn = matches!(outcome, VerdictOutcome::Disagreed | VerdictOutcome::Decided);
        if level_warn {
            tracing::warn!(job = %case.job, shard = case.shard, round = case.round, checker = %case.check.worker,
                outcome = outcome.as_str(), outvoted = ?outvoted, detail = %detail, "check verdict");
        } else {
            tracing::info!(job = %case.job, shard = case.shard, round = case.round, checker = %case.check.worker,
                outcome = outcome.as_str(), detail = %detail, "check verdict");
        }
        let verdict = self
            .publish_event(
                &case.job,
                case.shard,
                u64::from(case.round),
                EventKind::Verdict {
                    round: case.round,
                    outcome,
                    outvoted,
                    stands,
                    sha256,
                    detail,
                },
            )
            .await?;
        self.fold_local(verdict).await;
        if outcome == VerdictOutcome::Disagreed {
            let mut avoid: Vec<String> = case
                .primary
                .iter()
                .map(|p| subjects::machine(&p.worker).to_owned())
                .collect();
            avoid.push(subjects::machine(&case.check.worker).to_owned());
            avoid.dedup();
            self.queue_round(case.job.clone(), case.shard, case.round + 1, avoid)
                .await;
        }
        Ok(())
    }

    /// Counts a strike against `worker`'s machine for its result of `shard`
    /// of `job` (once per shard; `at_ms`: the verdict's time), forgets
    /// strikes past their expiry, and quarantines the machine when those
    /// left reach the threshold.
    pub(super) async fn strike(&mut self, worker: &WorkerId, job: &JobId, shard: u32, at_ms: u64) {
        let machine = subjects::machine(worker).to_owned();
        self.expire_strikes();
        if at_ms < self.strikes_from() || !self.strikes.add(&machine, job, shard, at_ms) {
            return;
        }
        let strikes = self.strikes.since(&machine, 0);
        tracing::warn!(machine = %machine, worker = %worker, job = %job, shard, strikes,
            "a machine's result lost to the majority of check runs: strike");
        self.maybe_quarantine(&machine, Some((job, shard))).await;
    }

    /// The time before which strikes have expired (ms since the epoch).
    fn strikes_from(&self) -> u64 {
        let ttl = self
            .judge
            .as_ref()
            .map_or(u64::MAX, |j| j.strikes_expire_ms);
        now_ms().saturating_sub(ttl)
    }

    /// Forgets the strikes past their expiry.
    pub(super) fn expire_strikes(&mut self) {
        let n = self.strikes.expire(self.strikes_from());
        if n > 0 {
            tracing::info!(strikes = n, "strikes expired");
        }
    }

    /// Quarantines `machine` when its strikes reach the threshold beyond
    /// those the quarantine bucket says were acted on; then withdraws its
    /// results in open jobs and queues those shards again elsewhere.
    pub(super) async fn maybe_quarantine(&mut self, machine: &str, last: Option<(&JobId, u32)>) {
        let Some(judge) = self.judge.clone() else {
            return;
        };
        let Some(kv) = judge.quarantine.clone() else {
            return;
        };
        // Strikes count from the machine's last release by an operator.
        let released_at = match kv.get(machine).await {
            Ok(Some(bytes)) => {
                match decode::<Quarantine>(
                    "quarantine record",
                    &bytes,
                    limits::MAX_QUARANTINE_BYTES,
                ) {
                    // Already quarantined: its results were withdrawn then,
                    // and any since are as they arrive.
                    Ok(q) if q.quarantined => {
                        self.quarantined
                            .entry(machine.to_owned())
                            .or_insert(q.strikes);
                        return;
                    }
                    Ok(q) => q.at_ms,
                    Err(_) => 0,
                }
            }
            Ok(None) => 0,
            Err(e) => {
                tracing::warn!(machine, error = %e, "the quarantine bucket could not be read; will retry");
                self.retries.push(Retry::Quarantine(machine.to_owned()));
                return;
            }
        };
        if self.strikes.since(machine, released_at) < judge.quarantine_after.max(1) {
            return;
        }
        // All its strikes held, released or not: they only grow between two
        // quarantines (expiry takes days), so message ids that carry them
        // are new each time.
        let strikes = self.strikes.since(machine, 0);
        let record = Quarantine {
            v: SCHEMA_VERSION,
            machine: machine.to_owned(),
            quarantined: true,
            strikes,
            reason: match last {
                Some((job, shard)) => format!(
                    "{strikes} of its results outvoted by check runs on other machines; the last: job {job} shard {shard}"
                ),
                None => {
                    format!("{strikes} of its results outvoted by check runs on other machines")
                }
            },
            by: judge.name.to_string(),
            at_ms: now_ms(),
        };
        if let Err(e) = crate::trust::quarantined::put(&kv, &record, self.js.as_ref()).await {
            tracing::warn!(machine, error = %e, "the quarantine could not be written; will retry");
            self.retries.push(Retry::Quarantine(machine.to_owned()));
            return;
        }
        tracing::error!(machine, strikes, reason = %record.reason,
            "machine quarantined: its workers pull nothing until `minions worker release`; its results in open jobs run again elsewhere");
        self.quarantined.insert(machine.to_owned(), strikes);
        let rerun = self.rerun_machine(machine, strikes).await;
        tracing::warn!(
            machine,
            shards = rerun,
            "results of a quarantined machine withdrawn and queued again"
        );
    }

    /// Withdraws the results `machine` made in jobs not complete before
    /// this watchdog looked, and queues those shards again on other
    /// machines. Returns how many.
    async fn rerun_machine(&mut self, machine: &str, strikes: u32) -> usize {
        self.reopen_made_on(machine).await;
        let mine: Vec<(JobId, u32, WorkerId, String, u64)> = self
            .jobs
            .iter()
            .filter(|(_, t)| t.sealed != Some(true))
            .flat_map(|(job, t)| {
                t.shards.iter().filter_map(move |(&i, s)| {
                    let d = s.done.as_ref()?;
                    (subjects::machine(&d.worker) == machine).then(|| {
                        (
                            job.clone(),
                            i,
                            d.worker.clone(),
                            d.sha256.clone(),
                            s.fold.attempts(),
                        )
                    })
                })
            })
            .collect();
        let mut n = 0;
        for (job, shard, worker, sha256, attempt) in mine {
            n += usize::from(
                self.rerun_shard(&job, shard, worker, sha256, attempt, machine, strikes)
                    .await,
            );
        }
        n
    }

    /// Whether `machine`'s quarantine record still says quarantined (true
    /// when it cannot be read: a result is withdrawn rather than trusted).
    async fn still_quarantined(&self, machine: &str) -> bool {
        let Some(kv) = self.judge.as_ref().and_then(|j| j.quarantine.clone()) else {
            return false;
        };
        match kv.get(machine).await {
            Ok(Some(bytes)) => {
                decode::<Quarantine>("quarantine record", &bytes, limits::MAX_QUARANTINE_BYTES)
                    .map_or(true, |q| q.quarantined)
            }
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// Withdraws one result of a quarantined machine (a `rejected` event)
    /// and queues its shard again avoiding the machine; true when done.
    #[allow(clippy::too_many_arguments)]
    async fn rerun_shard(
        &mut self,
        job: &JobId,
        shard: u32,
        worker: WorkerId,
        sha256: String,
        attempt: u64,
        machine: &str,
        strikes: u32,
    ) -> bool {
        let reason =
            format!("made on machine {machine}, quarantined after {strikes} results were outvoted");
        let r = self
            .publish_event(
                job,
                shard,
                attempt,
                EventKind::Rejected {
                    by: worker,
                    sha256,
                    reason,
                },
            )
            .await;
        let rejection = match r {
            Ok(e) => e,
            Err(why) => {
                tracing::warn!(job = %job, shard, error = %why, "a quarantined machine's result could not be withdrawn");
                return false;
            }
        };
        // Withdrawn here at once (the job must not complete with it); the
        // event's copy from the stream counts the rejection.
        if let Some(t) = self.jobs.get_mut(job) {
            t.withdraw(&rejection);
        }
        // The withdrawn output goes: a run that found it would report it
        // as its own (an output already written counts as done).
        let output = StorePath::from(keys::shard_output(job, shard));
        match self.store.delete(&output).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(job = %job, shard, error = %e, "a withdrawn output could not be removed");
                return false;
            }
        }
        if let Err(why) = self.requeue_avoiding(job, shard, machine, strikes).await {
            tracing::warn!(job = %job, shard, error = %why, "a withdrawn shard could not be queued again");
            return false;
        }
        true
    }

    async fn requeue_avoiding(
        &mut self,
        job: &JobId,
        shard: u32,
        machine: &str,
        strikes: u32,
    ) -> Result<(), String> {
        let (Some(js), Some(judge)) = (self.js.clone(), self.judge.clone()) else {
            return Err("no NATS connection".to_owned());
        };
        let cancelled = StorePath::from(keys::job_cancelled(job));
        if self.store.head(&cancelled).await.is_ok() {
            return Ok(());
        }
        let spec = match self.spec(job).await {
            SpecRead::Found(spec) => spec,
            _ => return Err("the job's spec cannot be read".to_owned()),
        };
        minions_endpoints::queue::ensure_job_consumer(&js, &judge.work, &spec)
            .await
            .map_err(|e| e.to_string())?;
        let mut task = spec.task(shard);
        task.avoid = vec![machine.to_owned()];
        let bytes = encode("shard task", &task).map_err(|e| e.to_string())?;
        resilient::publish_once(
            &js,
            &subjects::work(job, shard),
            &format!(
                "{}/quarantine/{machine}/{strikes}",
                subjects::msg_id(job, shard)
            ),
            bytes.into(),
        )
        .await
        .map_err(|e| format!("queueing the shard again: {e}"))?;
        Ok(())
    }
}
