//! Serving requests in the watchdogs' queue group (submit claims, job
//! requests, canaries): the next request to answer, and sending the
//! answer. An answer that cannot be sent is logged; the asker times out
//! and says so.

use futures::StreamExt;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// The next message on `sub` that asks for an answer, with the subject
/// to answer on; `None` once `stop` is cancelled or `sub` ends.
pub async fn next_request(
    sub: &mut async_nats::Subscriber,
    stop: &CancellationToken,
) -> Option<(async_nats::Message, async_nats::Subject)> {
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => return None,
            m = sub.next() => m?,
        };
        if let Some(reply) = msg.reply.clone() {
            return Some((msg, reply));
        }
    }
}

/// Sends `answer` (a `what`, for the log) to `reply`.
pub async fn send<T: Serialize>(
    client: &async_nats::Client,
    reply: async_nats::Subject,
    what: &'static str,
    answer: &T,
) {
    match minions_schemas::encode(what, answer) {
        Ok(bytes) => {
            if let Err(e) = client.publish(reply, bytes.into()).await {
                tracing::warn!(what, error = %e, "an answer could not be sent");
            }
        }
        Err(e) => tracing::warn!(what, error = %e, "an answer does not encode"),
    }
}
