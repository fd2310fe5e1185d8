//! Publishing a shard's events (started, progress, done, failed, handed
//! back) on its event subject: plainly, or confirmed by the stream where
//! the event must not be lost before the ack.

use minions_endpoints::resilient;
use minions_schemas::messages::{Energy, EventKind, ShardEvent, ShardTask};
use minions_schemas::{encode, subjects};

use crate::context::Ctx;

/// How long a confirmed shard event keeps trying through a cluster's leader
/// election before the shard is handed back (well inside the ack wait).
const EVENT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

/// Publishes a shard event; with `confirm`, through JetStream, waiting for
/// the stream to store it; without, as a plain publish the stream stores
/// without answering (nobody would read the answer). Returns whether it was
/// sent (and, with `confirm`, stored).
pub(crate) async fn publish_event(
    ctx: &Ctx,
    task: &ShardTask,
    attempt: u64,
    kind: EventKind,
    confirm: bool,
) -> bool {
    publish(ctx, task, attempt, kind, confirm, None).await
}

/// [`publish_event`] with the delivery's energy, for the events that end a
/// delivery (done, failed, handed back).
pub(crate) async fn publish(
    ctx: &Ctx,
    task: &ShardTask,
    attempt: u64,
    kind: EventKind,
    confirm: bool,
    energy: Option<Energy>,
) -> bool {
    let event = ShardEvent::by_worker(
        task.job.clone(),
        task.shard,
        ctx.identity.worker_id(),
        ctx.identity.host.clone(),
        attempt,
        kind,
    )
    .with_energy(energy);
    let bytes = match encode("shard event", &event) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "shard event does not encode");
            return false;
        }
    };
    let subject = subjects::event(&task.job, task.shard, &event.worker);
    if !confirm {
        return match ctx.client.publish(subject, bytes.into()).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(job = %task.job, shard = task.shard, error = %e, "shard event not sent");
                false
            }
        };
    }
    // Retried through leader elections; the message id keeps a retry whose
    // first try was stored from being stored twice.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, event.msg_id().as_str());
    match resilient::publish_confirmed(&ctx.js, &subject, headers, bytes.into(), EVENT_PATIENCE)
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(job = %task.job, shard = task.shard, error = %e, "shard event not confirmed");
            false
        }
    }
}
