//! A job's progress, folded from its spec and its shard events.

use std::collections::BTreeMap;

use anyhow::Context;
use async_nats::jetstream;
use minions_schemas::endpoints::snapshot;
use minions_schemas::messages::{EventKind, JobSpec, ShardEvent};
use minions_schemas::{JobId, decode, keys, limits, streams, subjects};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::Serialize;

use crate::store_io::job_spec;

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
}

/// A shard that failed for good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedShard {
    /// The shard.
    pub shard: u32,
    /// Why.
    pub reason: String,
    /// Deliveries it had.
    pub attempts: u64,
}

/// A job's progress.
#[derive(Debug, Clone, Serialize)]
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
    /// Records per second since the first shard started.
    pub rate: f64,
    /// Seconds to finish at that rate (None before any is done).
    pub eta_secs: Option<f64>,
    /// Failed shards with reasons.
    pub failed_shards: Vec<FailedShard>,
}

#[derive(Default)]
struct ShardState {
    done: bool,
    running: bool,
    failed: Option<String>,
    attempts: u64,
}

/// Loads the job's spec (an unknown job is an error) and folds its events.
pub async fn load(
    js: &jetstream::Context,
    store: &dyn ObjectStore,
    job: &JobId,
) -> anyhow::Result<Progress> {
    let spec = job_spec(store, job).await?;
    let events = read_events(js, job).await?;
    let mut p = fold(&spec, &events, minions_schemas::time::now_ms());
    let marker = StorePath::from(keys::job_cancelled(job));
    if p.state != JobState::Done && store.head(&marker).await.is_ok() {
        p.state = JobState::Cancelled;
    }
    Ok(p)
}

async fn read_events(js: &jetstream::Context, job: &JobId) -> anyhow::Result<Vec<ShardEvent>> {
    let messages = snapshot::read(
        js,
        streams::EVENTS_STREAM,
        &subjects::job_events(job),
        false,
    )
    .await
    .context("reading the job's events")?;
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        match decode::<ShardEvent>("shard event", &m.payload, limits::MAX_EVENT_BYTES) {
            Ok(e) if &e.job == job => out.push(e),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(subject = %m.subject, error = %e, "ignoring an event that does not decode")
            }
        }
    }
    Ok(out)
}

/// Folds events (in stream order) into progress; `now_ms` is the clock.
pub fn fold(spec: &JobSpec, events: &[ShardEvent], now_ms: u64) -> Progress {
    let mut shards: BTreeMap<u32, ShardState> = BTreeMap::new();
    let mut first_start: Option<u64> = None;
    let mut last_done: Option<u64> = None;
    for e in events {
        if e.shard >= spec.shards {
            continue;
        }
        let s = shards.entry(e.shard).or_default();
        s.attempts = s.attempts.max(e.attempt);
        match &e.kind {
            EventKind::Started => {
                first_start = Some(first_start.map_or(e.at_ms, |t| t.min(e.at_ms)));
                if !s.done {
                    s.running = true;
                }
            }
            EventKind::Done { .. } => {
                s.done = true;
                s.running = false;
                s.failed = None;
                last_done = Some(last_done.map_or(e.at_ms, |t| t.max(e.at_ms)));
            }
            EventKind::Requeued => {
                s.failed = None;
                s.running = false;
            }
            EventKind::Failed { reason, permanent } => {
                s.running = false;
                if *permanent && !s.done {
                    s.failed = Some(reason.clone());
                }
            }
        }
    }
    let mut p = Progress {
        job: spec.job.to_string(),
        state: JobState::Pending,
        model: spec.model_name.to_string(),
        records: spec.records,
        shards: spec.shards,
        done: 0,
        running: 0,
        pending: 0,
        failed: 0,
        records_done: 0,
        redeliveries: 0,
        rate: 0.0,
        eta_secs: None,
        failed_shards: Vec::new(),
    };
    for (&shard, s) in &shards {
        p.redeliveries += s.attempts.saturating_sub(1);
        if s.done {
            p.done += 1;
            p.records_done += spec.shard_rows(shard);
        } else if let Some(reason) = &s.failed {
            p.failed += 1;
            p.failed_shards.push(FailedShard {
                shard,
                reason: reason.clone(),
                attempts: s.attempts,
            });
        } else if s.running {
            p.running += 1;
        }
    }
    p.pending = spec.shards - p.done - p.failed - p.running;
    p.state = if p.done == spec.shards {
        JobState::Done
    } else if p.done + p.failed == spec.shards {
        JobState::Failed
    } else if p.done + p.running + p.failed > 0 {
        JobState::Running
    } else {
        JobState::Pending
    };
    if let Some(start) = first_start {
        let end = if p.state == JobState::Done {
            last_done.unwrap_or(now_ms)
        } else {
            now_ms
        };
        let secs = (end.saturating_sub(start) as f64 / 1000.0).max(0.001);
        p.rate = p.records_done as f64 / secs;
        if p.rate > 0.0 {
            let left = spec.records.saturating_sub(p.records_done) as f64;
            p.eta_secs = Some(left / p.rate);
        }
    }
    p
}

fn human_secs(s: f64) -> String {
    let s = s.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

impl Progress {
    /// The human-readable report.
    pub fn render(&self) -> String {
        let pct = if self.shards == 0 {
            0.0
        } else {
            100.0 * f64::from(self.done) / f64::from(self.shards)
        };
        let state = match self.state {
            JobState::Failed => format!("completed with {} failed", self.failed),
            s => s.as_str().to_owned(),
        };
        let mut out = format!(
            "job {}: {state}\n  model    {}\n  records  {} in {} shards\n  shards   {} done, {} running, {} pending, {} failed ({pct:.1}% done)\n",
            self.job,
            self.model,
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
        if self.redeliveries > 0 {
            out.push_str(&format!("  retries  {} redeliveries\n", self.redeliveries));
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
    use minions_schemas::messages::{InputDescription, ModelFamily};
    use minions_schemas::{ModelHash, ModelName, SCHEMA_VERSION, WorkerId};

    fn spec() -> Result<JobSpec, minions_schemas::IdError> {
        Ok(JobSpec {
            v: SCHEMA_VERSION,
            job: JobId::new("j")?,
            model_name: ModelName::new("m")?,
            model_hash: ModelHash::new("a".repeat(64))?,
            family: ModelFamily::BertEmbedding,
            input: InputDescription {
                source: "x".into(),
                sha256: String::new(),
                bytes: 0,
                text_field: "text".into(),
                id_field: None,
            },
            shard_size: 10,
            max_batch: 0,
            shards: 4,
            records: 35,
            skipped: 0,
            created_ms: 0,
        })
    }

    fn ev(
        shard: u32,
        attempt: u64,
        at_ms: u64,
        kind: EventKind,
    ) -> Result<ShardEvent, minions_schemas::IdError> {
        Ok(ShardEvent {
            v: SCHEMA_VERSION,
            job: JobId::new("j")?,
            shard,
            worker: WorkerId::new("w")?,
            host: "h".into(),
            attempt,
            at_ms,
            kind,
        })
    }

    fn done() -> EventKind {
        EventKind::Done {
            rows: 10,
            output_bytes: 1,
            duration_ms: 1,
            compute_ms: 1,
            already_done: false,
            sha256: String::new(),
        }
    }

    #[test]
    fn folds_events() -> Result<(), minions_schemas::IdError> {
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
    fn a_done_shard_stays_done_after_a_late_duplicate() -> Result<(), minions_schemas::IdError> {
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
}
