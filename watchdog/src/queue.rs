//! The work queue as JetStream reports it: depth, undelivered, unacked
//! against the consumer's limit, waiting pulls. Polled, since JetStream
//! pushes none of it.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use minions_schemas::{JobId, streams, subjects};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::view::View;

/// The work queue at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueInfo {
    /// Whether the last poll succeeded.
    pub ok: bool,
    /// Why the last poll failed, if it did.
    pub error: Option<String>,
    /// Messages in the work stream (queued or running, not yet acked).
    pub depth: u64,
    /// Messages not yet delivered to any worker.
    pub pending: u64,
    /// Delivered and not yet acknowledged.
    pub ack_pending: u64,
    /// A job consumer's limit on `ack_pending` (the largest); at it, JetStream stops
    /// delivering without a word.
    pub max_ack_pending: u64,
    /// Pull requests waiting (idle worker slots asking for work).
    pub waiting: u64,
    /// Messages delivered more than once, now unacked.
    pub redelivered: u64,
    /// Job consumers (jobs with a consumer: queued, running or just done).
    pub jobs: u64,
    /// Dead-letter records stored.
    pub dead_letters: u64,
    /// When this was read (ms since the epoch).
    pub at_ms: u64,
}

/// Reads the queue once.
pub async fn read(js: &jetstream::Context) -> QueueInfo {
    let mut q = QueueInfo {
        at_ms: minions_schemas::time::now_ms(),
        ..Default::default()
    };
    let result: Result<(), String> = async {
        let stream = js
            .get_stream(streams::WORK_STREAM)
            .await
            .map_err(|e| e.to_string())?;
        let info = stream.get_info().await.map_err(|e| e.to_string())?;
        q.depth = info.state.messages;
        // One consumer per job: the queue's figures are their sums.
        let mut consumers = stream.consumers();
        while let Some(c) = consumers.next().await {
            let c = c.map_err(|e| e.to_string())?;
            if minions_schemas::scheduling::consumer_job(&c.name).is_none() {
                continue;
            }
            q.pending += c.num_pending;
            q.ack_pending += c.num_ack_pending as u64;
            q.max_ack_pending = q
                .max_ack_pending
                .max(u64::try_from(c.config.max_ack_pending).unwrap_or(0));
            q.waiting += c.num_waiting as u64;
            q.redelivered += c.num_redelivered as u64;
            q.jobs += 1;
        }
        if let Ok(dead) = js.get_stream(streams::DEAD_STREAM).await
            && let Ok(info) = dead.get_info().await
        {
            q.dead_letters = info.state.messages;
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => q.ok = true,
        Err(e) => q.error = Some(e),
    }
    q
}

/// Messages of `job` in the work stream (None when it cannot be read).
pub async fn queued_for(js: &jetstream::Context, job: &JobId) -> Option<u64> {
    let stream = js.get_stream(streams::WORK_STREAM).await.ok()?;
    let mut subjects = stream
        .info_with_subjects(subjects::job_work(job))
        .await
        .ok()?;
    let mut n = 0;
    while let Some(s) = subjects.next().await {
        n += s.ok()?.1 as u64;
    }
    Some(n)
}

/// Polls the queue into `view` every `every` until `stop`.
pub async fn poll(
    js: jetstream::Context,
    view: Arc<View>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                let q = read(&js).await;
                if let Some(e) = &q.error {
                    tracing::debug!(error = %e, "work queue not read");
                }
                view.set_queue(q);
            }
        }
    }
}
