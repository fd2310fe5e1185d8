//! A finished job's progress without its shards: what a watchdog keeps of
//! a job once its manifest (the record of every shard) is written, so that
//! its memory grows with open work, not with history. A closed fold is
//! reopened from that manifest when the job moves again (a retry of its
//! failed shards, a result withdrawn).

use serde::{Deserialize, Serialize};

use super::{JobFold, Progress, ShardFold, ShardState, Times};
use crate::messages::{JobManifest, JobSpec};

/// Failed shards a closed job's progress lists, at most (its manifest
/// lists them all; the count is always whole).
pub const CLOSED_FAILED_LISTED: usize = 100;

/// A finished job's progress, frozen when it closed, with its spec.
/// Invariant: its size does not depend on the job's shard count.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClosedFold {
    spec: JobSpec,
    progress: Progress,
    times: Times,
}

impl JobFold {
    /// The fold without its shards, its progress frozen at `now_ms`.
    pub fn close(self, now_ms: u64) -> ClosedFold {
        let mut progress = self.progress(now_ms);
        progress.failed_shards.truncate(CLOSED_FAILED_LISTED);
        ClosedFold {
            times: self.times(),
            spec: self.spec,
            progress,
        }
    }

    /// The fold of `spec` whose shards are as the manifest `m` records them
    /// (done by the result it names, or failed for good); shards it does
    /// not list stay pending.
    fn from_record(spec: JobSpec, m: &JobManifest, times: Times) -> Self {
        let n = usize::try_from(spec.shards).unwrap_or(0);
        let mut shards = vec![ShardState::default(); n];
        for s in &m.shards {
            let Some(st) = usize::try_from(s.shard)
                .ok()
                .and_then(|i| shards.get_mut(i))
            else {
                continue;
            };
            st.fold = if s.outcome == "done" {
                ShardFold::recorded(
                    Some(s.sha256.as_deref().unwrap_or_default()),
                    None,
                    s.attempts,
                )
            } else {
                ShardFold::recorded(
                    None,
                    Some(s.reason.clone().unwrap_or_else(|| s.outcome.clone())),
                    s.attempts,
                )
            };
        }
        Self::from_shards(spec, shards, times)
    }
}

impl ClosedFold {
    /// The closed fold of a job found finished without folding its events:
    /// its counts are its manifest's.
    pub fn from_record(spec: JobSpec, m: &JobManifest) -> Self {
        let times = Times {
            last_done: Some(m.completed_ms),
            rejected: u64::from(m.rejected),
            disagreements: u64::from(m.disagreements),
            unverified: u64::from(m.unverified),
            ..Times::default()
        };
        let mut closed = JobFold::from_record(spec, m, times).close(m.completed_ms);
        closed.progress.verified = m.verified;
        closed
    }

    /// The job's spec.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// Its progress when it closed.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// The fold again, its shards as the manifest `m` records them, its
    /// times and counts as they were; tokens of its done shards are not in
    /// the manifest and count from zero.
    pub fn reopen(self, m: &JobManifest) -> JobFold {
        JobFold::from_record(self.spec, m, self.times)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{EventKind, ManifestShard, ShardEvent, WATCHDOG_HOST};
    use crate::progress::JobState;

    fn manifest(spec: &JobSpec, failed: &[u32]) -> JobManifest {
        JobManifest {
            v: crate::SCHEMA_VERSION,
            job: spec.job.clone(),
            model_hash: spec.model_hash.clone(),
            records: spec.records,
            done: spec.shards - failed.len() as u32,
            failed: failed.len() as u32,
            rejected: 0,
            verified: 0,
            disagreements: 0,
            unverified: 0,
            shards: (0..spec.shards)
                .map(|i| {
                    let bad = failed.contains(&i);
                    ManifestShard {
                        shard: i,
                        outcome: if bad { "failed" } else { "done" }.into(),
                        output_key: None,
                        sha256: (!bad).then(|| format!("sha{i}")),
                        worker: None,
                        made_by: None,
                        attempts: 1,
                        duration_ms: 1,
                        reason: bad.then(|| "bad input".to_owned()),
                    }
                })
                .collect(),
            completed_ms: 100,
        }
    }

    #[test]
    fn a_closed_job_keeps_its_counts_and_reopens_from_its_manifest()
    -> Result<(), Box<dyn std::error::Error>> {
        let spec = crate::messages::test_spec_of("j", 40, 400)?;
        let m = manifest(&spec, &[3, 7]);
        let fold = JobFold::from_record(spec.clone(), &m, Times::default());
        let open = fold.progress(100);
        assert_eq!(
            (open.state, open.done, open.failed),
            (JobState::Failed, 38, 2)
        );
        let closed = fold.clone().close(100);
        // Closing keeps the progress and drops the shards.
        assert_eq!(closed.progress(), &open);
        let small = rmp_serde::to_vec_named(&closed)?.len();
        let big = rmp_serde::to_vec_named(&fold)?.len();
        assert!(small < big, "closed {small} bytes, open {big}");
        // Found finished: the manifest's counts.
        let found = ClosedFold::from_record(spec.clone(), &m);
        assert_eq!((found.progress().done, found.progress().failed), (38, 2));
        assert_eq!(found.progress().records_done, 380);
        // A retry reopens it: the failed shard runs and the job is done.
        let mut reopened = closed.reopen(&m);
        assert_eq!(reopened.progress(100), open);
        for (shard, kind) in [(3, EventKind::Requeued), (7, EventKind::Requeued)] {
            reopened.apply(&ShardEvent::test_event(shard, 2, 200, kind)?);
        }
        assert_eq!(reopened.progress(200).state, JobState::Running);
        let done = |sha: &str| EventKind::test_done(10, sha);
        reopened.apply(&ShardEvent::test_event(3, 2, 300, done("new3"))?);
        reopened.apply(&ShardEvent::test_event(7, 2, 300, done("new7"))?);
        assert_eq!(reopened.progress(300).state, JobState::Done);
        // A withdrawn result names the recorded one.
        let mut withdrawn = ShardEvent::test_event(
            5,
            1,
            400,
            EventKind::Rejected {
                by: crate::WorkerId::new("w")?,
                sha256: "sha5".into(),
                reason: "quarantined".into(),
            },
        )?;
        withdrawn.host = WATCHDOG_HOST.into();
        reopened.apply(&withdrawn);
        assert!(!reopened.is_done(5));
        Ok(())
    }
}
