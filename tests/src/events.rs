//! Reading a job's shard events back from the events stream.

use crate::Result;

/// Every event of `job` in the events stream of `js` so far, in stream
/// order.
pub async fn job_events(
    js: &async_nats::jetstream::Context,
    job: &str,
) -> Result<Vec<minions_schemas::messages::ShardEvent>> {
    use futures::StreamExt;
    let stream = js
        .get_stream(minions_schemas::streams::EVENTS_STREAM)
        .await?;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
            filter_subject: format!("minions.events.{job}.>"),
            ..Default::default()
        })
        .await?;
    let mut out = Vec::new();
    if consumer.cached_info().num_pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await?;
    while let Some(m) = messages.next().await {
        let m = m?;
        let pending = m.info().map(|i| i.pending).unwrap_or(0);
        out.push(minions_schemas::decode("shard event", &m.payload, 1 << 20)?);
        if pending == 0 {
            break;
        }
    }
    Ok(out)
}
