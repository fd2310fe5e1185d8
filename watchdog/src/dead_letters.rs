//! Dead letters. JetStream has none of its own: a work-queue message that
//! reaches max deliveries stays in the stream, silently. The watchdog turns
//! the max-deliveries advisory into a permanent failure event (published with
//! a message id, so several watchdogs publish it once) and removes the
//! message from the work stream. The job tracker turns every permanent
//! failure into a dead-letter record.

use async_nats::jetstream;
use minions_schemas::messages::{EventKind, ShardEvent, ShardTask};
use minions_schemas::{WorkerId, decode, encode, limits, streams, subjects};
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
    let again = msg
        .headers
        .get(async_nats::header::NATS_MESSAGE_ID)
        .and_then(|id| id.as_str().rsplit_once("/again-"))
        .and_then(|(_, n)| n.parse::<u32>().ok())
        .unwrap_or(0);
    if let Some(task) = task
        .as_ref()
        .filter(|t| t.check > 0 && again < CHECK_REQUEUES)
    {
        // A check run handed back by the machines it avoids as often as
        // the consumer allows (each pull may reach one of them): queued
        // anew on the subject it had (the job's check subjects, or its
        // shard's own for an older job), a few times, before it is given up.
        let checks = subjects::check_work(&task.job, task.shard);
        let subject = if msg.subject.as_str() == checks {
            checks
        } else {
            subjects::work(&task.job, task.shard)
        };
        let bytes = encode("shard task", task).map_err(|e| e.to_string())?;
        minions_endpoints::resilient::publish_once(
            js,
            &subject,
            &format!(
                "{}/check/{}/again-{}",
                subjects::msg_id(&task.job, task.shard),
                task.check,
                again + 1
            ),
            bytes.into(),
        )
        .await
        .map_err(|e| e.to_string())?;
        tracing::info!(job = %task.job, shard = task.shard, check = task.check, again = again + 1,
            "a check run reached max deliveries; queued anew");
    } else if let Some(task) = task.as_ref().filter(|t| t.check > 0) {
        // A check run no other machine took: the shard's own result stands
        // unchecked; nothing failed. The verdict closes the check, so that
        // the job can complete.
        let event = watchdog_event(
            task,
            watchdog,
            u64::from(task.check),
            EventKind::Verdict {
                round: task.check,
                outcome: minions_schemas::messages::VerdictOutcome::Undecided,
                outvoted: Vec::new(),
                stands: None,
                sha256: String::new(),
                detail: format!(
                    "no other machine ran the check run in {} deliveries (avoiding {})",
                    adv.deliveries,
                    task.avoid.join(", ")
                ),
            },
        );
        let bytes = encode("shard event", &event).map_err(|e| e.to_string())?;
        minions_endpoints::resilient::publish_once(
            js,
            &subjects::event(&task.job, task.shard, &event.worker),
            &event.msg_id(),
            bytes.into(),
        )
        .await
        .map_err(|e| e.to_string())?;
        tracing::warn!(job = %task.job, shard = task.shard, check = task.check, deliveries = adv.deliveries,
            avoid = ?task.avoid, "no other machine ran a check run of the shard; it stays unchecked");
    } else if let Some(task) = task {
        let event = watchdog_event(
            &task,
            watchdog,
            adv.deliveries,
            EventKind::Failed {
                reason: format!(
                    "no worker finished it in {} deliveries (each worker died, hung or was stopped)",
                    adv.deliveries
                ),
                permanent: true,
                stream_seq: Some(adv.stream_seq),
            },
        );
        let bytes = encode("shard event", &event).map_err(|e| e.to_string())?;
        minions_endpoints::resilient::publish_once(
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

/// An event about `task`'s shard sent by this watchdog.
fn watchdog_event(
    task: &ShardTask,
    watchdog: &WorkerId,
    attempt: u64,
    kind: EventKind,
) -> ShardEvent {
    ShardEvent::by_watchdog(
        task.job.clone(),
        task.shard,
        watchdog.clone(),
        attempt,
        kind,
    )
}

/// How many times a check run that reached max deliveries is queued anew
/// before it is given up (`undecided`).
const CHECK_REQUEUES: u32 = 1000;

/// The max-deliveries advisory subject of every job consumer.
pub fn advisory_subject() -> String {
    subjects::max_deliveries_advisory(streams::WORK_STREAM, "*")
}
