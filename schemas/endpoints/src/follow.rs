//! Reading the events stream (or a filter of it) in order, from a given
//! sequence, without ever stalling for good.
//!
//! An ordered consumer recreates itself when it sees a gap or misses its
//! heartbeats, but after a server restart it was seen to go silent while
//! the stream grew: heartbeats kept coming, messages did not, and the
//! dashboard froze. A [`Follower`] checks for that: when it has waited
//! `stall_after` for a message, it asks the stream for its last sequence,
//! and when the stream holds events past the last one read, it replaces the
//! consumer with a new one starting right after it. Sequences never go
//! back: a message at or below the last sequence returned is dropped.

use std::time::Duration;

use async_nats::jetstream::{
    self,
    consumer::{DeliverPolicy, pull::Ordered, pull::OrderedConfig},
};
use futures::StreamExt;
use minions_schemas::{streams, subjects};

/// How long a follower waits for a message before it checks whether the
/// stream moved on without it.
pub const STALL_AFTER: Duration = Duration::from_secs(3);

/// Why following the stream failed.
#[derive(Debug, thiserror::Error)]
#[error("following the events stream: {0}")]
pub struct FollowError(String);

fn err<E: std::fmt::Display>(e: E) -> FollowError {
    FollowError(e.to_string())
}

/// One message read, with its stream sequence and how many more the
/// consumer had when it was sent.
pub struct Read {
    /// Its sequence in the events stream.
    pub seq: u64,
    /// Messages the consumer still had after it.
    pub pending: u64,
    /// The message itself.
    pub message: jetstream::Message,
}

/// An in-order reader of every event from a sequence on; see the module.
pub struct Follower {
    stream: jetstream::stream::Stream,
    filter: String,
    messages: Ordered,
    /// The last sequence returned (or the one before the start).
    last: u64,
    /// Messages pending when the consumer was made.
    backlog: u64,
    stall_after: Duration,
    /// Consumers replaced after a stall.
    replaced: u64,
}

impl Follower {
    /// Starts reading every event at sequence `after + 1`.
    pub async fn start(js: &jetstream::Context, after: u64) -> Result<Self, FollowError> {
        Self::start_with(js, subjects::EVENT_SUBJECTS, after, STALL_AFTER).await
    }

    /// Starts reading the events on `filter` at sequence `after + 1`, with
    /// the stall check's wait chosen.
    pub async fn start_with(
        js: &jetstream::Context,
        filter: &str,
        after: u64,
        stall_after: Duration,
    ) -> Result<Self, FollowError> {
        let stream = js.get_stream(streams::EVENTS_STREAM).await.map_err(err)?;
        let (messages, backlog) = consumer(&stream, filter, after).await?;
        Ok(Self {
            stream,
            filter: filter.to_owned(),
            messages,
            last: after,
            backlog,
            stall_after,
            replaced: 0,
        })
    }

    /// Messages the consumer had when the follower started.
    pub fn backlog(&self) -> u64 {
        self.backlog
    }

    /// Consumers replaced because they stalled.
    pub fn replaced(&self) -> u64 {
        self.replaced
    }

    /// The next message; `None` only if the consumer ended. Cancel safe:
    /// a cancelled call loses no message.
    pub async fn next(&mut self) -> Option<Result<Read, FollowError>> {
        loop {
            let quiet = tokio::time::sleep(self.stall_after);
            tokio::select! {
                m = self.messages.next() => {
                    let m = match m? {
                        Ok(m) => m,
                        Err(e) => return Some(Err(err(e))),
                    };
                    let Ok(info) = m.info() else {
                        tracing::warn!(subject = %m.subject, "event without stream metadata ignored");
                        continue;
                    };
                    let (seq, pending) = (info.stream_sequence, info.pending);
                    if seq <= self.last {
                        continue;
                    }
                    self.last = seq;
                    return Some(Ok(Read { seq, pending, message: m }));
                }
                _ = quiet => self.check().await,
            }
        }
    }

    /// Replaces the consumer when the stream holds events past the last
    /// one read.
    async fn check(&mut self) {
        let last_in_stream = match self
            .stream
            .get_last_raw_message_by_subject(&self.filter)
            .await
        {
            Ok(m) => m.sequence,
            Err(e) => {
                // None on the filter yet, or the stream not reachable.
                tracing::debug!(error = %e, "no last event on the filter for the stall check");
                return;
            }
        };
        if last_in_stream <= self.last {
            return;
        }
        match consumer(&self.stream, &self.filter, self.last).await {
            Ok((messages, _)) => {
                tracing::warn!(
                    read = self.last,
                    stream_last_seq = last_in_stream,
                    waited_ms = self.stall_after.as_millis() as u64,
                    "events consumer stalled behind the stream; replaced"
                );
                self.messages = messages;
                self.replaced += 1;
            }
            Err(e) => tracing::warn!(error = %e, "events consumer stalled; replacing it failed"),
        }
    }
}

/// An ordered consumer of the events on `filter` from `after + 1` on, with
/// the number of messages it has pending.
async fn consumer(
    stream: &jetstream::stream::Stream,
    filter: &str,
    after: u64,
) -> Result<(Ordered, u64), FollowError> {
    let c = stream
        .create_consumer(OrderedConfig {
            filter_subject: filter.to_owned(),
            deliver_policy: if after == 0 {
                DeliverPolicy::All
            } else {
                DeliverPolicy::ByStartSequence {
                    start_sequence: after + 1,
                }
            },
            ..Default::default()
        })
        .await
        .map_err(err)?;
    let backlog = c.cached_info().num_pending;
    Ok((c.messages().await.map_err(err)?, backlog))
}
