//! Acting on worker transitions: record them in the registry (JetStream KV,
//! compare-and-set, so with several watchdogs each transition is written by
//! one), and hand back a dead worker's deliveries at once.

use async_nats::jetstream::kv;
use bytes::Bytes;
use minions_schemas::messages::{Control, ControlCommand, Heartbeat, WorkerRecord, WorkerState};
use minions_schemas::time::now_ms;
use minions_schemas::{SCHEMA_VERSION, WorkerId, decode, encode, limits, subjects};

use crate::registry::Transition;

/// Writes a transition to the registry with compare-and-set. Returns true
/// when this watchdog made the write (and so owns the transition's side
/// effects), false when the registry already holds that state or a final
/// one (another watchdog got there first).
pub async fn record(
    kv: &kv::Store,
    t: &Transition,
    beat: &Heartbeat,
    handed_back: u32,
    by: &str,
) -> Result<bool, String> {
    let key = t.worker.as_str();
    let record = WorkerRecord {
        v: SCHEMA_VERSION,
        worker: t.worker.clone(),
        host: beat.host.clone(),
        device: beat.device.clone(),
        state: t.to,
        reason: t.reason.clone(),
        handed_back,
        changed_ms: now_ms(),
        by: by.to_owned(),
    };
    let bytes: Bytes = encode("worker record", &record)
        .map_err(|e| e.to_string())?
        .into();
    for _ in 0..3 {
        match kv.entry(key).await.map_err(|e| e.to_string())? {
            None => match kv.create(key, bytes.clone()).await {
                Ok(_) => return Ok(true),
                Err(_) => continue, // created meanwhile: read it again
            },
            Some(entry) => {
                if entry.operation == kv::Operation::Put {
                    let old: WorkerRecord =
                        decode("worker record", &entry.value, limits::MAX_EVENT_BYTES)
                            .map_err(|e| e.to_string())?;
                    if old.state == t.to || old.state.is_final() {
                        return Ok(false);
                    }
                }
                match kv.update(key, bytes.clone(), entry.revision).await {
                    Ok(_) => return Ok(true),
                    Err(_) => continue, // someone wrote meanwhile: read it again
                }
            }
        }
    }
    Ok(false)
}

/// The registry's record of a worker, if any.
pub async fn lookup(kv: &kv::Store, worker: &WorkerId) -> Option<WorkerRecord> {
    let bytes = kv.get(worker.as_str()).await.ok()??;
    decode("worker record", &bytes, limits::MAX_EVENT_BYTES).ok()
}

/// Hands back a dead worker's deliveries: a nak on each delivery's ack
/// subject returns it to the queue now, whatever the ack wait. Returns how
/// many were handed back.
pub async fn hand_back(client: &async_nats::Client, beat: &Heartbeat) -> u32 {
    let mut n = 0;
    for f in &beat.in_flight {
        if !f.reply.starts_with("$JS.ACK.") {
            tracing::warn!(worker = %beat.worker, reply = %f.reply, "ignoring an in-flight entry without an ack subject");
            continue;
        }
        match client
            .publish(f.reply.clone(), Bytes::from_static(b"-NAK"))
            .await
        {
            Ok(()) => {
                n += 1;
                tracing::warn!(worker = %beat.worker, job = %f.job, shard = f.shard, "handed back the shard of a dead worker");
            }
            Err(e) => {
                tracing::error!(worker = %beat.worker, job = %f.job, shard = f.shard, error = %e, "hand-back failed; the shard returns after the ack wait")
            }
        }
    }
    let _ = client.flush().await;
    n
}

/// Tells a fenced worker (declared dead, now beating again) to rejoin under
/// a new id.
pub async fn tell_rejoin(client: &async_nats::Client, worker: &WorkerId, by: &str) {
    let c = Control {
        v: SCHEMA_VERSION,
        command: ControlCommand::Rejoin,
        by: by.to_owned(),
    };
    if let Ok(bytes) = encode("control", &c) {
        let _ = client
            .publish(subjects::control(worker), bytes.into())
            .await;
    }
}

/// Whether a state is worth writing to the registry: idle and busy flip with
/// every shard and are read from live heartbeats instead.
pub fn worth_recording(t: &Transition) -> bool {
    !(matches!(t.to, WorkerState::Idle | WorkerState::Busy)
        && matches!(
            t.from,
            Some(WorkerState::Idle | WorkerState::Busy | WorkerState::Joining)
        ))
}
