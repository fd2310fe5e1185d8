//! Publishing shard tasks and CLI-side events.

use anyhow::Context;
use async_nats::jetstream;
use minions_endpoints::resilient;
use minions_schemas::messages::{EventKind, ShardEvent, ShardTask};
use minions_schemas::{JobId, encode, subjects};

/// Publishes one shard task under `msg_id`; true when the stream stored it
/// (false: a duplicate of a message id it has seen within its window).
pub async fn task(js: &jetstream::Context, task: &ShardTask, msg_id: &str) -> anyhow::Result<bool> {
    let payload = encode("shard task", task)?;
    let ack = resilient::publish_once(
        js,
        &subjects::work(&task.job, task.shard),
        msg_id,
        payload.into(),
    )
    .await
    .with_context(|| {
        format!(
            "the work stream did not confirm shard {} of job {}",
            task.shard, task.job
        )
    })?;
    Ok(!ack.duplicate)
}

/// Publishes an event about a shard on behalf of the CLI.
pub async fn event(
    js: &jetstream::Context,
    job: &JobId,
    shard: u32,
    kind: EventKind,
) -> anyhow::Result<()> {
    let e = ShardEvent::by_cli(job.clone(), shard, kind)?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, e.msg_id().as_str());
    resilient::publish_confirmed(
        js,
        &subjects::event(job, shard, &e.worker),
        headers,
        encode("shard event", &e)?.into(),
        resilient::PATIENCE,
    )
    .await
    .context("the events stream did not confirm")?;
    Ok(())
}
