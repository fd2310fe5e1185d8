//! Shard messages that no job consumer delivers: those of jobs queued
//! before jobs had consumers of their own (the shared consumer of the
//! earlier layout), and messages that belong to no job at all. The first get
//! their job's consumer; the second are removed and named in the log, as a
//! worker would have terminated them.

use std::collections::HashSet;
use std::sync::Arc;

use async_nats::jetstream;
use minions_schemas::messages::{JobSpec, QueuedJob};
use minions_schemas::{JobId, decode, keys, limits, streams};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};

/// Messages looked at per sweep, at most.
const PER_SWEEP: usize = 2_000;

/// Walks the work stream a little at a time from `cursor`.
pub struct OrphanSweep {
    cursor: u64,
}

impl Default for OrphanSweep {
    fn default() -> Self {
        Self::new()
    }
}

impl OrphanSweep {
    /// A sweep that starts at the stream's head.
    pub fn new() -> Self {
        Self { cursor: 0 }
    }

    /// When the work stream holds more messages than the job consumers
    /// account for, looks at up to [`PER_SWEEP`] of them and gives each
    /// orphan's job its consumer, or removes the orphan when it belongs to
    /// no job. Returns how many orphans were handled.
    pub async fn sweep(
        &mut self,
        js: &jetstream::Context,
        store: &Arc<dyn ObjectStore>,
        settings: &streams::WorkSettings,
        jobs: &[QueuedJob],
    ) -> usize {
        let Ok(mut stream) = js.get_stream(streams::WORK_STREAM).await else {
            return 0;
        };
        let Ok(info) = stream.info().await else {
            return 0;
        };
        let (messages, first, last) = (
            info.state.messages,
            info.state.first_sequence,
            info.state.last_sequence,
        );
        let accounted: u64 = jobs.iter().map(|j| j.pending + j.running).sum();
        if messages <= accounted {
            return 0;
        }
        let known: HashSet<&JobId> = jobs.iter().map(|j| &j.job).collect();
        let mut adopted: HashSet<JobId> = HashSet::new();
        let mut handled = 0;
        let mut seq = self.cursor.max(first);
        for _ in 0..PER_SWEEP {
            if seq > last {
                seq = first;
                break;
            }
            let msg = match stream
                .get_first_raw_message_by_subject(minions_schemas::subjects::WORK_SUBJECTS, seq)
                .await
            {
                Ok(m) => m,
                Err(_) => {
                    seq = first;
                    break;
                }
            };
            seq = msg.sequence + 1;
            let job = msg
                .subject
                .as_str()
                .split('.')
                .nth(2)
                .and_then(|j| JobId::new(j).ok());
            let check_run = msg.subject.as_str().split('.').nth(3) == Some("check");
            if let Some(j) = &job
                && (known.contains(j) || adopted.contains(j))
            {
                continue;
            }
            let spec = match &job {
                Some(j) => read_spec(store.as_ref(), j).await,
                None => None,
            };
            handled += 1;
            match spec {
                Some(spec) => {
                    if check_run
                        && let Err(e) =
                            minions_endpoints::queue::ensure_check_consumer(js, settings, &spec)
                                .await
                    {
                        tracing::warn!(job = %spec.job, error = %e, "cannot make a check consumer for queued check runs");
                    }
                    match minions_endpoints::queue::ensure_job_consumer(js, settings, &spec).await {
                        Ok(_) => tracing::warn!(job = %spec.job,
                            "shards queued without a job consumer (queued before jobs had their own): consumer made"),
                        Err(e) => {
                            tracing::warn!(job = %spec.job, error = %e, "cannot make a job consumer for queued shards")
                        }
                    }
                    adopted.insert(spec.job);
                }
                None => {
                    tracing::error!(subject = %msg.subject, stream_seq = msg.sequence,
                        "undecodable work message: it belongs to no job (no job spec in the store); removed");
                    let _ = stream.delete_message(msg.sequence).await;
                }
            }
        }
        self.cursor = seq;
        handled
    }
}

/// A job's spec from the store; `None` when it cannot be read or decoded.
pub(crate) async fn read_spec(store: &dyn ObjectStore, job: &JobId) -> Option<JobSpec> {
    let got = store
        .get(&StorePath::from(keys::job_spec(job)))
        .await
        .ok()?;
    if got.meta.size > limits::MAX_SPEC_BYTES as u64 {
        return None;
    }
    let bytes = got.bytes().await.ok()?;
    decode::<JobSpec>("job spec", &bytes, limits::MAX_SPEC_BYTES).ok()
}
