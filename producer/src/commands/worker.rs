//! `minions worker list|drain|evict|resume`: the fleet as the registry and
//! the heartbeat stream show it, and control of one worker.

use std::collections::BTreeMap;

use anyhow::Context;
use async_nats::jetstream;
use minions_endpoints::{control, snapshot};
use minions_schemas::messages::{ControlCommand, Quarantine, WorkerRecord};
use minions_schemas::time::now_ms;
use minions_schemas::{WorkerId, decode, limits, streams, subjects};
use serde::Serialize;

use crate::cli::Endpoints;

/// One worker as `minions worker list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerRow {
    /// Worker id.
    pub worker: String,
    /// Host.
    pub host: String,
    /// Device.
    pub device: String,
    /// The worker's build (empty for workers of older releases).
    pub build: String,
    /// The kernel path it runs (empty for workers of older releases).
    pub kernel: String,
    /// State: from the registry when final, else from the last heartbeat.
    pub state: String,
    /// Whether the owner lets the worker run, and why not.
    pub owner: String,
    /// Shards running.
    pub running: usize,
    /// The most shards it holds at once (its slots, and the shards that
    /// join its running generation batch).
    pub holds: u32,
    /// Shards done since the worker started.
    pub done: u64,
    /// Milliseconds since the last heartbeat.
    pub last_beat_ms: u64,
    /// Why its machine is quarantined, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<String>,
    /// The stage of a group it holds, if any (a model split by layers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
}

async fn connect(
    endpoints: &Endpoints,
    who: &str,
) -> anyhow::Result<(async_nats::Client, jetstream::Context)> {
    // Read-only: never creates streams or the work consumer (whoever creates
    // the consumer sets its ack wait and max deliveries).
    endpoints.connect(who).await
}

/// Lists workers: the last heartbeat of each, with the registry's verdict.
pub async fn list(endpoints: &Endpoints, json: bool) -> anyhow::Result<String> {
    let (_client, js) = connect(endpoints, "minions worker list").await?;
    // Read as it is: made by whoever set up the fleet, with the work
    // stream's replica count (a registry made here would have this
    // command's). None yet: no worker has joined.
    let kv = js.get_key_value(streams::WORKERS_BUCKET).await.ok();
    let beats = snapshot::last_heartbeats(&js).await?;
    let quarantined = quarantined(&js).await;
    let mut rows = BTreeMap::new();
    for hb in beats {
        let age = now_ms().saturating_sub(hb.at_ms);
        let mut state = if silent(&hb, now_ms()) {
            "silent".to_owned()
        } else {
            hb.state().as_str().to_owned()
        };
        if let Some(kv) = &kv
            && let Ok(Some(bytes)) = kv.get(hb.worker.as_str()).await
            && let Ok(rec) =
                decode::<WorkerRecord>("worker record", &bytes, limits::MAX_EVENT_BYTES)
            && rec.state.is_final()
        {
            state = rec.state.as_str().to_owned();
        }
        let q = quarantined.get(subjects::machine(&hb.worker)).cloned();
        if q.is_some() && !matches!(state.as_str(), "dead" | "left" | "silent") {
            state = "quarantined".to_owned();
        }
        rows.insert(
            hb.worker.to_string(),
            WorkerRow {
                worker: hb.worker.to_string(),
                host: hb.host.clone(),
                device: hb.device.clone(),
                build: hb.build.clone(),
                kernel: hb.kernel.clone(),
                state,
                owner: hb.owner.clone(),
                running: hb.in_flight.len(),
                holds: hb.holds_at_most(),
                done: hb.done,
                last_beat_ms: age,
                quarantined: q,
                stage: hb.stage.as_ref().map(|s| s.describe()),
            },
        );
    }
    let rows: Vec<WorkerRow> = rows.into_values().collect();
    if json {
        return Ok(serde_json::to_string_pretty(&rows)?);
    }
    if rows.is_empty() {
        return Ok("no workers have sent a heartbeat in the last hour".to_owned());
    }
    let mut out = format!(
        "{:<28} {:<20} {:<8} {:<9} {:>7} {:>8} {:>10}  {:<12} {}\n",
        "WORKER", "HOST", "DEVICE", "STATE", "RUNNING", "DONE", "LAST BEAT", "KERNEL", "BUILD"
    );
    let notes: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            r.quarantined
                .as_ref()
                .map(|why| format!("{} is quarantined: {why}", machine_of(&r.worker)))
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let stages: Vec<String> = rows
        .iter()
        .filter(|r| !matches!(r.state.as_str(), "dead" | "left" | "silent"))
        .filter_map(|r| r.stage.as_ref().map(|s| format!("{} holds {s}", r.worker)))
        .collect();
    for r in rows {
        out.push_str(&format!(
            "{:<28} {:<20} {:<8} {:<9} {:>7} {:>8} {:>8.1}s  {:<12} {}\n",
            r.worker,
            r.host,
            r.device,
            r.state,
            format!("{}/{}", r.running, r.holds),
            r.done,
            r.last_beat_ms as f64 / 1000.0,
            or_unknown(&r.kernel),
            or_unknown(&r.build)
        ));
    }
    for n in notes {
        out.push_str(&format!(
            "machine {n} (`minions worker release` lifts it)\n"
        ));
    }
    for s in stages {
        out.push_str(&format!("{s}\n"));
    }
    Ok(out.trim_end().to_owned())
}

/// Whether a worker missed three beats without saying it was leaving.
pub(crate) fn silent(hb: &minions_schemas::messages::Heartbeat, now_ms: u64) -> bool {
    now_ms.saturating_sub(hb.at_ms) > 3 * hb.interval_ms.max(1) && !hb.leaving
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "?" } else { s }
}

/// The quarantined machines and why, from the quarantine bucket (empty when
/// it cannot be read).
async fn quarantined(js: &jetstream::Context) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(kv) = js.get_key_value(streams::QUARANTINE_BUCKET).await else {
        return out;
    };
    let Ok(mut keys) = kv.keys().await else {
        return out;
    };
    use futures::StreamExt;
    while let Some(Ok(k)) = keys.next().await {
        if let Ok(Some(bytes)) = kv.get(&k).await
            && let Ok(q) =
                decode::<Quarantine>("quarantine record", &bytes, limits::MAX_QUARANTINE_BYTES)
            && q.quarantined
        {
            out.insert(k, q.reason);
        }
    }
    out
}

/// Lifts the quarantine of `machine` (a machine name or a worker id on it):
/// rewrites its record as released, keeping its strike count, so that a
/// watchdog quarantines it again only after new strikes.
pub async fn release(endpoints: &Endpoints, machine: &str) -> anyhow::Result<String> {
    let (_client, js) = connect(endpoints, "minions worker release").await?;
    let by = endpoints.security.identity_name();
    let actor = control::Actor {
        by: &by,
        via: "cli",
    };
    match control::release(&js, actor, machine).await {
        Ok(r) => Ok(format!(
            "machine {} released ({} strikes so far); its workers pull again within a few seconds",
            r.machine, r.strikes
        )),
        // Nothing to do is not a failure.
        Err(e @ control::ControlError::NotQuarantined(_, "released before")) => Ok(e.to_string()),
        Err(e) => Err(e.into()),
    }
}

/// Sends a control request to one worker and waits for its answer.
pub async fn control(
    endpoints: &Endpoints,
    worker: &str,
    command: ControlCommand,
) -> anyhow::Result<String> {
    let id = WorkerId::new(worker).context("worker id")?;
    let (client, js) = connect(endpoints, "minions worker").await?;
    let by = endpoints.security.identity_name();
    let actor = control::Actor {
        by: &by,
        via: "cli",
    };
    let r = control::ask(&client, &js, actor, &id, command).await?;
    Ok(format!(
        "worker {}: {} ({} shards handed back)",
        r.worker, r.status, r.handed_back
    ))
}

/// The machine part of a worker id as text (the id itself when it is not
/// a valid one).
fn machine_of(worker: &str) -> String {
    WorkerId::new(worker).map_or_else(
        |_| worker.to_owned(),
        |id| subjects::machine(&id).to_owned(),
    )
}
