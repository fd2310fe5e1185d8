//! Reading what a stream holds now: every message matching a filter (or the
//! last per subject), once, in stream order, without a durable consumer.

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull::OrderedConfig};
use futures::StreamExt;

/// Why a stream could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading stream {stream}: {reason}")]
pub struct SnapshotError {
    /// The stream.
    pub stream: String,
    /// What went wrong.
    pub reason: String,
}

/// The payloads of the messages in `stream` matching `filter`, in stream
/// order: all of them, or with `last_per_subject` only the newest of each
/// subject. Stops at what the stream held when the read began.
pub async fn read(
    js: &jetstream::Context,
    stream: &str,
    filter: &str,
    last_per_subject: bool,
) -> Result<Vec<async_nats::jetstream::Message>, SnapshotError> {
    let policy = if last_per_subject {
        DeliverPolicy::LastPerSubject
    } else {
        DeliverPolicy::All
    };
    read_with(js, stream, filter, policy, usize::MAX).await
}

/// At most `max` messages of `stream` matching `filter` after sequence
/// `after`, in stream order, with their sequences. Stops at what the
/// stream held when the read began.
pub async fn read_after(
    js: &jetstream::Context,
    stream: &str,
    filter: &str,
    after: u64,
    max: usize,
) -> Result<Vec<(u64, async_nats::jetstream::Message)>, SnapshotError> {
    let policy = DeliverPolicy::ByStartSequence {
        start_sequence: after + 1,
    };
    let messages = read_with(js, stream, filter, policy, max).await?;
    Ok(messages
        .into_iter()
        .filter_map(|m| {
            let seq = m.info().ok()?.stream_sequence;
            (seq > after).then_some((seq, m))
        })
        .collect())
}

async fn read_with(
    js: &jetstream::Context,
    stream: &str,
    filter: &str,
    deliver_policy: DeliverPolicy,
    max: usize,
) -> Result<Vec<async_nats::jetstream::Message>, SnapshotError> {
    let err = |e: &dyn std::fmt::Display| SnapshotError {
        stream: stream.to_owned(),
        reason: e.to_string(),
    };
    let s = js.get_stream(stream).await.map_err(|e| err(&e))?;
    let consumer = s
        .create_consumer(OrderedConfig {
            filter_subject: filter.to_owned(),
            deliver_policy,
            ..Default::default()
        })
        .await
        .map_err(|e| err(&e))?;
    let mut out = Vec::new();
    if consumer.cached_info().num_pending == 0 || max == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await.map_err(|e| err(&e))?;
    while let Some(m) = messages.next().await {
        let m = m.map_err(|e| err(&e))?;
        let pending = m.info().map(|i| i.pending).unwrap_or(0);
        out.push(m);
        if pending == 0 || out.len() >= max {
            break;
        }
    }
    Ok(out)
}

/// The last heartbeat of every worker the heartbeat stream remembers (an
/// hour); beats that do not decode are skipped. A missing stream reads as none.
pub async fn last_heartbeats(
    js: &jetstream::Context,
) -> Result<Vec<minions_schemas::messages::Heartbeat>, SnapshotError> {
    if js
        .get_stream(minions_schemas::streams::HEARTBEATS_STREAM)
        .await
        .is_err()
    {
        return Ok(Vec::new());
    }
    let messages = read(
        js,
        minions_schemas::streams::HEARTBEATS_STREAM,
        minions_schemas::subjects::HEARTBEAT_ALL,
        true,
    )
    .await?;
    Ok(messages
        .iter()
        .filter_map(|m| {
            minions_schemas::decode(
                "heartbeat",
                &m.payload,
                minions_schemas::limits::MAX_HEARTBEAT_BYTES,
            )
            .ok()
        })
        .collect())
}
