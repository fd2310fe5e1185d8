//! Riding out a cluster's leader elections. While a stream or consumer
//! elects a new leader (its server was lost, restarted or stepped down),
//! JetStream answers with "no responders", 503 or nothing at all for a few
//! seconds. A publish or API call that meets that is retried with back-off
//! for a bounded time; message ids keep a retried publish from being stored
//! twice.

use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishError, context::PublishErrorKind};
use bytes::Bytes;

/// How long a publish or API call keeps trying through a leader election
/// before its error is returned. Elections take seconds; a rolling restart
/// of a server a little longer.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Whether an error's text (its whole source chain) is one that a leader
/// election or a reconnect produces and that passes by itself.
pub fn transient_text(text: &str) -> bool {
    let t = text.to_lowercase();
    [
        "timed out",
        "timeout",
        "no responders",
        "503",
        "temporarily unavailable",
        "10008",
        "leadership",
        "broken pipe",
        "disconnected",
        "not connected",
        "no stream found",
        "jetstream system",
        "insufficient resources",
        "no suitable peers",
        "stream is offline",
        "consumer is offline",
    ]
    .iter()
    .any(|needle| t.contains(needle))
}

/// An error and all its sources, joined with ": ".
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// Whether a publish error can pass once a leader is elected or the
/// connection is back (a wrong expected sequence or an oversized message
/// never passes).
pub fn transient_publish(e: &PublishError) -> bool {
    match e.kind() {
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::StreamNotFound
        | PublishErrorKind::MaxAckPending => true,
        PublishErrorKind::Other => transient_text(&chain(e)),
        _ => false,
    }
}

/// The pause before try number `n` (0-based): 50 ms doubling to 2 s.
fn pause(n: u32) -> Duration {
    Duration::from_millis(50u64.saturating_mul(1u64 << n.min(6))).min(MAX_PAUSE)
}

/// [`publish_confirmed`] of one message under the message id `msg_id`
/// (the stream stores it once however often it is published within its
/// duplicate window), with [`PATIENCE`].
pub async fn publish_once(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: Bytes,
) -> Result<jetstream::publish::PublishAck, PublishError> {
    let mut headers = HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
    publish_confirmed(js, subject, headers, payload, PATIENCE).await
}

/// Publishes to a stream and waits for it to confirm, retrying through
/// leader elections and reconnects for up to `patience`. Give the message
/// a `Nats-Msg-Id` header wherever a duplicate would matter: a try whose
/// confirmation was lost may have been stored.
pub async fn publish_confirmed(
    js: &jetstream::Context,
    subject: &str,
    headers: HeaderMap,
    payload: Bytes,
    patience: Duration,
) -> Result<jetstream::publish::PublishAck, PublishError> {
    let start = Instant::now();
    let mut n = 0u32;
    loop {
        let tried = match js
            .publish_with_headers(subject.to_owned(), headers.clone(), payload.clone())
            .await
        {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match tried {
            Ok(ack) => {
                if n > 0 {
                    tracing::info!(
                        subject,
                        tries = n + 1,
                        waited_ms = start.elapsed().as_millis() as u64,
                        "publish confirmed after a leader election or reconnect"
                    );
                }
                return Ok(ack);
            }
            Err(e) if transient_publish(&e) && start.elapsed() < patience => {
                tracing::debug!(subject, error = %e, tries = n + 1, "publish not confirmed; trying again");
                tokio::time::sleep(pause(n)).await;
                n += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs `call` until it succeeds, fails for a reason that does not pass
/// by itself, or `patience` is spent. For idempotent JetStream API calls
/// (create-if-missing, info, stream reads). `what` names it in logs.
pub async fn patiently<T, E, F, Fut>(what: &str, patience: Duration, mut call: F) -> Result<T, E>
where
    E: std::error::Error + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    let mut n = 0u32;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                let text = chain(&e);
                if !transient_text(&text) || start.elapsed() >= patience {
                    return Err(e);
                }
                if n.is_multiple_of(10) {
                    tracing::info!(what, error = %text, "JetStream not ready (a leader election?); trying again");
                }
                tokio::time::sleep(pause(n)).await;
                n += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn election_answers_are_transient() {
        for t in [
            "jetstream error: JetStream system temporarily unavailable (code 503, error code 10008)",
            "timed out: didn't receive ack in time",
            "no responders",
            "request error: 409 Leadership Change",
            "stream is offline",
        ] {
            assert!(transient_text(t), "{t}");
        }
        for t in [
            "stream name already in use with a different configuration",
            "wrong last sequence: 7",
            "maximum payload exceeded",
            "authorization violation",
        ] {
            assert!(!transient_text(t), "{t}");
        }
    }

    #[test]
    fn pauses_grow_and_stop_at_two_seconds() {
        assert_eq!(pause(0), Duration::from_millis(50));
        assert_eq!(pause(1), Duration::from_millis(100));
        assert_eq!(pause(5), Duration::from_millis(1600));
        assert_eq!(pause(6), MAX_PAUSE);
        assert_eq!(pause(40), MAX_PAUSE);
    }

    #[test]
    fn publish_kinds() {
        assert!(transient_publish(&PublishError::new(
            PublishErrorKind::TimedOut
        )));
        assert!(!transient_publish(&PublishError::new(
            PublishErrorKind::WrongLastSequence
        )));
        assert!(!transient_publish(&PublishError::new(
            PublishErrorKind::MaxPayloadExceeded
        )));
    }
}
