//! Dead letters. JetStream has none of its own: a work-queue message that
//! reaches max deliveries stays in the stream, silently. The watchdog turns
//! the max-deliveries advisory into a permanent failure event (published with
//! a message id, so several watchdogs publish it once) and removes the
//! message from the work stream. The job tracker turns every permanent
//! failure into a dead-letter record.

use async_nats::jetstream;
use minions_schemas::messages::{EventKind, ShardEvent, ShardTask};
use minions_schemas::time::now_ms;
use minions_schemas::{SCHEMA_VERSION, WorkerId, decode, encode, limits, streams, subjects};
use serde::Deserialize;

/// The part of a JetStream consumer advisory the watchdog reads.
#[derive(Debug, Deserialize)]
pub struct Advisory {
    /// The stream sequence of the message.
    pub stream_seq: u64,
    /// Deliveries it had.
    #[serde(default)]
    pub deliveries: u64,
}

/// Handles one max-deliveries advisory.
pub async fn on_max_deliveries(
    js: &jetstream::Context,
    work: &jetstream::stream::Stream,
    payload: &[u8],
    watchdog: &WorkerId,
) -> Result<(), String> {
    if payload.len() > limits::MAX_EVENT_BYTES {
        return Err(format!("advisory of {} bytes ignored", payload.len()));
    }
    let adv: Advisory =
        serde_json::from_slice(payload).map_err(|e| format!("advisory does not parse: {e}"))?;
    let msg = match work.get_raw_message(adv.stream_seq).await {
        Ok(m) => m,
        // Already removed (by another watchdog, or acked at the last moment).
        Err(_) => return Ok(()),
    };
    let task: Option<ShardTask> = decode("shard task", &msg.payload, limits::MAX_TASK_BYTES).ok();
    if let Some(task) = task.as_ref().filter(|t| t.check > 0) {
        // A check run no other machine took: the shard's own result stands
        // unchecked; nothing failed.
        tracing::warn!(job = %task.job, shard = task.shard, check = task.check, deliveries = adv.deliveries,
            avoid = ?task.avoid, "no other machine ran a check run of the shard; it stays unchecked");
    } else if let Some(task) = task {
        let event = ShardEvent {
            energy: None,
            v: SCHEMA_VERSION,
            job: task.job.clone(),
            shard: task.shard,
            worker: watchdog.clone(),
            host: minions_schemas::messages::WATCHDOG_HOST.to_owned(),
            attempt: adv.deliveries,
            at_ms: now_ms(),
            kind: EventKind::Failed {
                reason: format!(
                    "no worker finished it in {} deliveries (each worker died, hung or was stopped)",
                    adv.deliveries
                ),
                permanent: true,
            },
        };
        let bytes = encode("shard event", &event).map_err(|e| e.to_string())?;
        minions_schemas::endpoints::resilient::publish_once(
            js,
            &subjects::event(&task.job, task.shard, &event.worker),
            &format!("maxdeliver/{}/{}/{}", task.job, task.shard, adv.stream_seq),
            bytes.into(),
        )
        .await
        .map_err(|e| e.to_string())?;
        tracing::error!(job = %task.job, shard = task.shard, deliveries = adv.deliveries, "shard reached max deliveries; dead-lettered");
    } else {
        tracing::error!(stream_seq = adv.stream_seq, subject = %msg.subject, "an undecodable message reached max deliveries; removed");
    }
    match work.delete_message(adv.stream_seq).await {
        Ok(_) => {}
        Err(e) => {
            tracing::debug!(stream_seq = adv.stream_seq, error = %e, "message already removed")
        }
    }
    Ok(())
}

/// The max-deliveries advisory subject of every job consumer.
pub fn advisory_subject() -> String {
    subjects::max_deliveries_advisory(streams::WORK_STREAM, "*")
}
