//! The job tracker: follows every shard event, writes a dead-letter record
//! for each shard that failed for good, and a job manifest when every shard
//! of a job is done or failed. Both writes are idempotent (message ids, a
//! check of what is already there, create-or-compare puts), so several
//! watchdogs, or one that restarts and replays the events, write each once.
//! It also folds every event into the shared [`View`] for the dashboard.

use std::collections::{BTreeMap, HashMap};

use async_nats::jetstream;
use minions_schemas::messages::{
    DeadLetter, EventKind, JobManifest, JobSpec, ManifestShard, ModelManifest, ShardEvent,
};
use minions_schemas::time::now_ms;
use minions_schemas::{
    JobId, SCHEMA_VERSION, WorkerId, decode, encode, keys, limits, streams, subjects,
};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};

use crate::view::View;

#[derive(Debug, Default, Clone)]
struct ShardTrack {
    done: Option<(WorkerId, String, u64)>,
    failed: Option<String>,
    attempts: u64,
    hosts: Vec<String>,
}

impl ShardTrack {
    /// Whether the shard counts as done, as failed for good, or neither.
    fn outcome(&self) -> (bool, bool) {
        (
            self.done.is_some(),
            self.done.is_none() && self.failed.is_some(),
        )
    }
}

#[derive(Debug, Default)]
struct JobTrack {
    spec: Option<JobSpec>,
    shards: BTreeMap<u32, ShardTrack>,
    /// Shards done, kept as events arrive (a count per event would cost a
    /// scan of every shard: quadratic in the job's size).
    done: u32,
    /// Shards failed for good and not done, kept likewise.
    failed: u32,
    /// (done, failed) counts of the last manifest written or found.
    manifest: Option<(u32, u32)>,
}

impl JobTrack {
    /// Folds one shard event into the job's shards and counts. Returns the
    /// reason and state of a shard that this event made fail for good.
    fn fold(&mut self, e: &ShardEvent) -> Option<(String, ShardTrack)> {
        let s = self.shards.entry(e.shard).or_default();
        let before = s.outcome();
        s.attempts = s.attempts.max(e.attempt);
        let mut dead = None;
        match &e.kind {
            EventKind::Started => {
                if s.hosts.last() != Some(&e.host) {
                    s.hosts.push(e.host.clone());
                }
            }
            EventKind::Done {
                sha256,
                duration_ms,
                ..
            } => {
                s.done = Some((e.worker.clone(), sha256.clone(), *duration_ms));
                s.failed = None;
            }
            EventKind::Requeued => s.failed = None,
            EventKind::HandedBack { .. }
            | EventKind::Submitted { .. }
            | EventKind::Progress { .. } => {}
            EventKind::Failed { reason, permanent } => {
                if *permanent && s.done.is_none() && s.failed.is_none() {
                    s.failed = Some(reason.clone());
                    dead = Some((reason.clone(), s.clone()));
                }
            }
        }
        let after = s.outcome();
        for (was, is, count) in [
            (before.0, after.0, &mut self.done),
            (before.1, after.1, &mut self.failed),
        ] {
            match (was, is) {
                (false, true) => *count += 1,
                (true, false) => *count = count.saturating_sub(1),
                _ => {}
            }
        }
        dead
    }
}

/// Follows shard events for every job.
pub struct Tracker {
    jobs: HashMap<JobId, JobTrack>,
    js: jetstream::Context,
    store: std::sync::Arc<dyn ObjectStore>,
    view: std::sync::Arc<View>,
}

impl Tracker {
    /// A tracker that writes records through `js` and manifests to `store`,
    /// and keeps every job's progress in `view`.
    pub fn new(
        js: jetstream::Context,
        store: std::sync::Arc<dyn ObjectStore>,
        view: std::sync::Arc<View>,
    ) -> Self {
        Self {
            jobs: HashMap::new(),
            js,
            store,
            view,
        }
    }

    /// Marks a job cancelled in the view.
    pub fn cancelled(&self, job: &JobId) {
        self.view.jobs().cancel(job);
    }

    /// Applies one event; writes what it completes.
    pub async fn apply(&mut self, e: ShardEvent) {
        let job = e.job.clone();
        self.show(&e).await;
        if matches!(e.kind, EventKind::Submitted { .. }) {
            return;
        }
        let dead = self.jobs.entry(job.clone()).or_default().fold(&e);
        if let Some((reason, s)) = dead {
            let payload = self
                .spec(&job)
                .await
                .and_then(|spec| encode("shard task", &spec.task(e.shard)).ok());
            self.dead_letter(
                &job,
                e.shard,
                reason,
                &s,
                e.attempt,
                payload.unwrap_or_default(),
            )
            .await;
        }
        self.maybe_complete(&job).await;
    }

    /// Folds the event into the view, adding its job first when new.
    async fn show(&mut self, e: &ShardEvent) {
        let known = self.view.jobs().knows(&e.job);
        if !known {
            let Some(spec) = self.spec(&e.job).await else {
                return;
            };
            let model_mb = self.model_mb(&spec).await;
            let marker = StorePath::from(keys::job_cancelled(&e.job));
            let cancelled = self.store.head(&marker).await.is_ok();
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

    async fn spec(&mut self, job: &JobId) -> Option<JobSpec> {
        let track = self.jobs.entry(job.clone()).or_default();
        if track.spec.is_none() {
            let key = StorePath::from(keys::job_spec(job));
            if let Ok(got) = self.store.get(&key).await
                && got.meta.size <= limits::MAX_SPEC_BYTES as u64
                && let Ok(bytes) = got.bytes().await
            {
                track.spec = decode("job spec", &bytes, limits::MAX_SPEC_BYTES).ok();
            }
        }
        track.spec.clone()
    }

    async fn dead_letter(
        &self,
        job: &JobId,
        shard: u32,
        reason: String,
        s: &ShardTrack,
        attempt: u64,
        payload: Vec<u8>,
    ) {
        let subject = subjects::dead(job, shard);
        // Already recorded for this delivery count (a replay after restart)?
        if let Ok(stream) = self.js.get_stream(streams::DEAD_STREAM).await
            && let Ok(last) = stream.get_last_raw_message_by_subject(&subject).await
            && let Ok(old) = decode::<DeadLetter>(
                "dead letter",
                &last.payload,
                limits::MAX_TASK_BYTES + limits::MAX_EVENT_BYTES,
            )
            && old.deliveries == attempt
        {
            return;
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
            hosts: s.hosts.clone(),
            stream_seq: 0,
            at_ms: now_ms(),
        };
        let Ok(bytes) = encode("dead letter", &record) else {
            return;
        };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            format!("{job}/{shard}/{attempt}").as_str(),
        );
        match minions_schemas::endpoints::resilient::publish_confirmed(
            &self.js,
            &subject,
            headers,
            bytes.into(),
            minions_schemas::endpoints::resilient::PATIENCE,
        )
        .await
        {
            Ok(a) if !a.duplicate => {
                tracing::warn!(job = %job, shard, deliveries = attempt, reason = %reason, hosts = ?s.hosts, "dead letter recorded")
            }
            Ok(_) => {}
            Err(e) => tracing::error!(job = %job, shard, error = %e, "dead letter not stored"),
        }
    }

    async fn maybe_complete(&mut self, job: &JobId) {
        let Some(track) = self.jobs.get(job) else {
            return;
        };
        let (done, failed) = (track.done, track.failed);
        if track.manifest == Some((done, failed))
            || track
                .spec
                .as_ref()
                .is_some_and(|s| done + failed < s.shards)
        {
            return;
        }
        let Some(spec) = self.spec(job).await else {
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
            shards: (0..spec.shards)
                .map(|i| {
                    let s = track.shards.get(&i).cloned().unwrap_or_default();
                    match (&s.done, &s.failed) {
                        (Some((worker, sha, ms)), _) => ManifestShard {
                            shard: i,
                            outcome: "done".into(),
                            output_key: Some(keys::shard_output(job, i)),
                            sha256: Some(sha.clone()),
                            worker: Some(worker.clone()),
                            attempts: s.attempts,
                            duration_ms: *ms,
                            reason: None,
                        },
                        (None, reason) => ManifestShard {
                            shard: i,
                            outcome: "failed".into(),
                            output_key: None,
                            sha256: None,
                            worker: None,
                            attempts: s.attempts,
                            duration_ms: 0,
                            reason: reason.clone(),
                        },
                    }
                })
                .collect(),
            completed_ms: now_ms(),
        };
        if self.write_manifest(&manifest).await
            && let Some(t) = self.jobs.get_mut(job)
        {
            t.manifest = Some((done, failed));
        }
    }

    /// Writes the manifest unless one with the same outcome is there; a
    /// manifest is replaced only by one with more shards done (after a retry).
    async fn write_manifest(&self, m: &JobManifest) -> bool {
        let key = StorePath::from(keys::job_manifest(&m.job));
        if let Ok(got) = self.store.get(&key).await
            && let Ok(bytes) = got.bytes().await
            && let Ok(old) =
                decode::<JobManifest>("job manifest", &bytes, limits::MAX_SPEC_BYTES * 64)
            && old.done >= m.done
        {
            return true;
        }
        let Ok(bytes) = encode("job manifest", m) else {
            return false;
        };
        let opts = PutOptions {
            mode: if m.failed == 0 {
                PutMode::Overwrite
            } else {
                PutMode::Create
            },
            ..Default::default()
        };
        match self.store.put_opts(&key, bytes.into(), opts).await {
            Ok(_) => {
                tracing::info!(job = %m.job, done = m.done, failed = m.failed, "job complete; manifest written");
                true
            }
            Err(object_store::Error::AlreadyExists { .. }) => true,
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

    #[test]
    fn running_counts_match_a_recount() -> Result<(), IdError> {
        let mut t = JobTrack::default();
        let mut seed = 7u64;
        let mut saw = (false, false);
        for _ in 0..5000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let shard = ((seed >> 33) % 50) as u32;
            let kind = match (seed >> 20) % 5 {
                0 => EventKind::Started,
                1 => EventKind::Done {
                    rows: 1,
                    output_bytes: 1,
                    duration_ms: 1,
                    compute_ms: 1,
                    already_done: false,
                    sha256: "00".into(),
                    tokens: 0,
                },
                2 => EventKind::Requeued,
                3 => EventKind::Failed {
                    reason: "x".into(),
                    permanent: true,
                },
                _ => EventKind::Failed {
                    reason: "y".into(),
                    permanent: false,
                },
            };
            t.fold(&event(shard, kind)?);
            let done = t.shards.values().filter(|s| s.outcome().0).count() as u32;
            let failed = t.shards.values().filter(|s| s.outcome().1).count() as u32;
            assert_eq!((t.done, t.failed), (done, failed));
            saw = (saw.0 || done > 0, saw.1 || failed > 0);
        }
        assert_eq!(saw, (true, true), "the sequence reached both outcomes");
        Ok(())
    }
}
