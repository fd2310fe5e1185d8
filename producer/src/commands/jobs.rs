//! `minions jobs`: the fleet's jobs, newest first, read from what the fleet
//! keeps: each job's `submitted` event in the events stream (one small
//! message per job, read with a subject filter), then, for the jobs shown
//! only, its spec, its manifest when it is finished, or its events' fold
//! while it runs.

use anyhow::Context;
use futures::StreamExt;
use minions_endpoints::snapshot;
use minions_schemas::messages::{EventKind, ShardEvent};
use minions_schemas::progress::{JobState, human_secs};
use minions_schemas::{JobId, decode, keys, limits, streams, subjects};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::Serialize;

use crate::cli::{Endpoints, JobsArgs};

/// How many jobs' details are read at once.
const AT_ONCE: usize = 16;

/// One job as `minions jobs` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobRow {
    /// The job id.
    pub job: String,
    /// The team it counts against ("" when its spec is gone).
    pub team: String,
    /// Who submitted it.
    pub submitter: String,
    /// The model's name.
    pub model: String,
    /// Where it stands (`unknown` when its spec is gone from the store).
    pub state: String,
    /// Shards done.
    pub done: u32,
    /// Shards failed for good.
    pub failed: u32,
    /// Shards in the job.
    pub shards: u32,
    /// When it was submitted (ms since the epoch).
    pub submitted_ms: u64,
    /// Seconds from its submission to its end, or to now while it runs.
    pub duration_secs: f64,
}

/// Runs `minions jobs`: the rows and the text to print.
pub async fn run(endpoints: &Endpoints, args: &JobsArgs) -> anyhow::Result<(Vec<JobRow>, String)> {
    let store = minions_endpoints::store::open(&endpoints.store_url())?;
    let (_, js) = endpoints.connect("minions jobs").await?;
    let now = minions_schemas::time::now_ms();
    let since_ms = args.since.map(|w| {
        let at = w.resolve(chrono::Utc::now());
        u64::try_from(at.timestamp_millis()).unwrap_or(0)
    });
    let submitted = submitted(&js).await?;
    let ids: Vec<(JobId, u64)> = submitted
        .into_iter()
        .filter(|(_, at)| since_ms.is_none_or(|s| *at >= s))
        .collect();
    let want_state = args.state.map(|s| s.state().as_str());
    let mut rows = Vec::new();
    for chunk in ids.chunks(AT_ONCE) {
        let got: Vec<anyhow::Result<JobRow>> = futures::stream::iter(chunk.iter().cloned())
            .map(|(job, at)| {
                let (js, store) = (&js, store.as_ref());
                async move { row(js, store, job, at, now).await }
            })
            .buffered(AT_ONCE)
            .collect()
            .await;
        for r in got {
            let r = r?;
            if args.team.as_ref().is_some_and(|t| *t != r.team)
                || want_state.is_some_and(|s| s != r.state)
            {
                continue;
            }
            rows.push(r);
            if rows.len() >= args.limit {
                break;
            }
        }
        if rows.len() >= args.limit {
            break;
        }
    }
    let text = if args.json {
        serde_json::to_string_pretty(&rows)?
    } else {
        render(
            &rows,
            ids_hint(&args.team, want_state, args.since.is_some()),
        )
    };
    Ok((rows, text))
}

/// Every job's id and submission time, newest first, from the `submitted`
/// events.
async fn submitted(js: &async_nats::jetstream::Context) -> anyhow::Result<Vec<(JobId, u64)>> {
    let messages = snapshot::read(
        js,
        streams::EVENTS_STREAM,
        subjects::SUBMITTED_EVENTS,
        false,
    )
    .await
    .context("reading the jobs' submitted events")?;
    let mut seen = std::collections::HashMap::new();
    for m in messages {
        let Ok(e) = decode::<ShardEvent>("shard event", &m.payload, limits::MAX_EVENT_BYTES) else {
            continue;
        };
        if matches!(e.kind, EventKind::Submitted { .. }) && e.is_on(&m.subject) {
            seen.entry(e.job).or_insert(e.at_ms);
        }
    }
    let mut out: Vec<(JobId, u64)> = seen.into_iter().collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    Ok(out)
}

/// One job's row: its spec, then its manifest when it is finished, else
/// the fold of its events.
async fn row(
    js: &async_nats::jetstream::Context,
    store: &dyn ObjectStore,
    job: JobId,
    submitted_ms: u64,
    now: u64,
) -> anyhow::Result<JobRow> {
    let mut r = JobRow {
        job: job.to_string(),
        team: String::new(),
        submitter: String::new(),
        model: String::new(),
        state: "unknown".to_owned(),
        done: 0,
        failed: 0,
        shards: 0,
        submitted_ms,
        duration_secs: 0.0,
    };
    let Ok(spec) = crate::store_io::job_spec(store, &job).await else {
        return Ok(r);
    };
    r.team = spec.team.clone();
    r.submitter = spec.submitter.clone();
    r.model = spec.model_name.to_string();
    r.shards = spec.shards;
    let cancelled = store
        .head(&StorePath::from(keys::job_cancelled(&job)))
        .await
        .is_ok();
    let finished = minions_endpoints::manifest::latest(store, &job)
        .await
        .with_context(|| format!("reading job {job}'s manifest"))?;
    let (state, end_ms) = match finished {
        Some((_, m)) if m.done + m.failed >= spec.shards => {
            r.done = m.done;
            r.failed = m.failed;
            let state = if m.failed > 0 {
                JobState::Failed
            } else {
                JobState::Done
            };
            (state, m.completed_ms)
        }
        _ => {
            let p = crate::progress::load(js, store, &job).await?;
            r.done = p.done;
            r.failed = p.failed;
            (p.state, now)
        }
    };
    let state = if cancelled && state != JobState::Done {
        JobState::Cancelled
    } else {
        state
    };
    r.state = state.as_str().to_owned();
    r.duration_secs = end_ms.saturating_sub(submitted_ms) as f64 / 1000.0;
    Ok(r)
}

/// What narrowed the list, for the line shown when nothing matched.
fn ids_hint(team: &Option<String>, state: Option<&str>, since: bool) -> String {
    let mut parts = Vec::new();
    if let Some(t) = team {
        parts.push(format!("team {t}"));
    }
    if let Some(s) = state {
        parts.push(format!("state {s}"));
    }
    if since {
        parts.push("--since".to_owned());
    }
    if parts.is_empty() {
        "no jobs in the events stream".to_owned()
    } else {
        format!("no jobs match ({})", parts.join(", "))
    }
}

/// The table: one line per job, newest first.
pub fn render(rows: &[JobRow], empty: String) -> String {
    if rows.is_empty() {
        return empty;
    }
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            let pct = if r.shards == 0 {
                0.0
            } else {
                100.0 * f64::from(r.done) / f64::from(r.shards)
            };
            let submitted = i64::try_from(r.submitted_ms)
                .ok()
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map_or_else(String::new, |t| t.format("%Y-%m-%d %H:%M:%S").to_string());
            [
                r.job.clone(),
                r.team.clone(),
                r.submitter.clone(),
                r.model.clone(),
                r.state.clone(),
                format!("{pct:.0}% ({}/{})", r.done, r.shards),
                submitted,
                human_secs(r.duration_secs),
            ]
        })
        .collect();
    let head = [
        "JOB",
        "TEAM",
        "SUBMITTER",
        "MODEL",
        "STATE",
        "PROGRESS",
        "SUBMITTED (UTC)",
        "DURATION",
    ];
    let mut width = head.map(str::len);
    for c in &cells {
        for (w, v) in width.iter_mut().zip(c) {
            *w = (*w).max(v.chars().count());
        }
    }
    let line = |vals: Vec<&str>| -> String {
        vals.iter()
            .zip(width)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = vec![line(head.to_vec())];
    out.extend(
        cells
            .iter()
            .map(|c| line(c.iter().map(String::as_str).collect())),
    );
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lines_up_and_says_when_empty() {
        let r = JobRow {
            job: "01ab".into(),
            team: "search".into(),
            submitter: "ana".into(),
            model: "minilm".into(),
            state: "running".into(),
            done: 3,
            failed: 0,
            shards: 4,
            submitted_ms: 1_700_000_000_000,
            duration_secs: 75.0,
        };
        let t = render(&[r], String::new());
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("JOB   TEAM    SUBMITTER  MODEL"),
            "{t}"
        );
        assert!(
            lines[1].contains("75% (3/4)") && lines[1].contains("1m 15s"),
            "{t}"
        );
        assert!(lines[1].contains("2023-11-14 22:13:20"), "{t}");
        assert_eq!(
            render(&[], ids_hint(&None, Some("done"), false)),
            "no jobs match (state done)"
        );
    }
}
