//! Following the events stream: restore the newest checkpoint, read the
//! stream from the sequence after it (all of it without one), fold every
//! event into the [`Tracker`], write checkpoints as the
//! [`CheckpointPolicy`] says, and log `events caught up` once the stream's
//! backlog is folded (with the sequence, the events read and the time
//! taken), so that a restart's cost can be seen and measured.
//!
//! Events are read by one task and folded by another, so that a slow store
//! never delays reading, and neither delays heartbeat handling. A
//! checkpoint is a copy of the state taken between two events, encoded and
//! written by a task of its own while the fold goes on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use minions_schemas::messages::ShardEvent;
use minions_schemas::time::now_ms;
use minions_schemas::{SCHEMA_VERSION, decode, limits, streams};
use object_store::ObjectStore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{self, CheckpointPolicy, Header, StreamFacts};
use crate::run::WatchdogError;
use crate::tracker::Tracker;
use crate::view::View;
use minions_endpoints::follow::Follower;

/// One message read from the stream: its sequence, how many more the
/// consumer had then, and its event (None when it is not a valid event:
/// it is skipped, but its sequence is covered all the same).
struct Read {
    seq: u64,
    pending: u64,
    event: Option<ShardEvent>,
}

fn follow_err<E: std::fmt::Display>(e: E) -> WatchdogError {
    WatchdogError::Follow {
        what: "the events stream",
        reason: e.to_string(),
    }
}

/// Starts following the events stream; the returned task ends once `stop`
/// is cancelled and a last checkpoint is written (when anything was folded
/// since the one before).
pub async fn start(
    js: &jetstream::Context,
    store: Arc<dyn ObjectStore>,
    view: Arc<View>,
    policy: CheckpointPolicy,
    name: String,
    judge: crate::tracker::Judge,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, WatchdogError> {
    let began = Instant::now();
    let mut stream = js
        .get_stream(streams::EVENTS_STREAM)
        .await
        .map_err(follow_err)?;
    let info = stream.info().await.map_err(follow_err)?;
    let facts = StreamFacts {
        last_seq: info.state.last_sequence,
        created: info.created.to_string(),
    };
    let mut tracker = Tracker::new(js.clone(), store.clone(), view, judge);
    let restored = if policy.disabled {
        None
    } else {
        checkpoint::restore_newest(store.as_ref(), &facts, &mut tracker).await
    };
    let from = match &restored {
        Some(h) => {
            tracing::info!(seq = h.seq, writer = %h.writer, age_secs = now_ms().saturating_sub(h.written_ms) / 1000,
                stream_last_seq = facts.last_seq, restore_ms = began.elapsed().as_millis() as u64,
                "resuming from checkpoint");
            tracker.resume().await;
            tracker.recheck_cancellations().await;
            h.seq
        }
        None => {
            tracing::info!(
                stream_last_seq = facts.last_seq,
                "no checkpoint; replaying the events stream from its start"
            );
            0
        }
    };
    let mut follower = Follower::start(js, from).await.map_err(follow_err)?;
    let backlog = follower.backlog();

    let (tx, mut rx) = tokio::sync::mpsc::channel::<Read>(4096);
    let reader = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                m = follower.next() => match m {
                    Some(Ok(minions_endpoints::follow::Read { seq, pending, message: m })) => {
                        let event = decode::<ShardEvent>("shard event", &m.payload, limits::MAX_EVENT_BYTES)
                            .ok()
                            .filter(|e| e.is_on(&m.subject));
                        if tx.send(Read { seq, pending, event }).await.is_err() {
                            break;
                        }
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "reading events"),
                    None => break,
                }
            }
        }
    });

    let mut fold = Fold {
        tracker,
        store,
        policy,
        name,
        created: facts.created,
        covered: from,
        written: from,
        since: 0,
        last_write: Instant::now(),
        writing: None,
    };
    Ok(tokio::spawn(async move {
        let mut read = 0u64;
        let mut caught_up = backlog == 0;
        if caught_up {
            caught_up_log(from, 0, began);
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                r = rx.recv() => {
                    let Some(r) = r else { break };
                    if let Some(e) = r.event {
                        fold.tracker.apply(e).await;
                    }
                    fold.covered = r.seq;
                    fold.since += 1;
                    read += 1;
                    if !caught_up && r.pending == 0 {
                        caught_up = true;
                        caught_up_log(r.seq, read, began);
                        fold.write().await;
                    }
                }
                r = fold.tracker.next_finished(), if fold.tracker.checks_running() => {
                    if let Some(r) = r {
                        fold.tracker.finished(r).await;
                    }
                }
                _ = tick.tick() => {
                    fold.tracker.retry(false).await;
                    if fold.policy.due(fold.since, fold.last_write.elapsed()) {
                        fold.write().await;
                    }
                }
            }
        }
        let _ = reader.await;
        fold.finish_write().await;
        fold.write().await;
        fold.finish_write().await;
    }))
}

fn caught_up_log(seq: u64, events: u64, began: Instant) {
    tracing::info!(
        seq,
        events,
        ms = began.elapsed().as_millis() as u64,
        "events caught up"
    );
}

/// A checkpoint being written: its key and size once written.
type Writing = JoinHandle<Result<(String, usize), checkpoint::CheckpointError>>;

/// The folding side: the tracker and what its checkpoints need.
struct Fold {
    tracker: Tracker,
    store: Arc<dyn ObjectStore>,
    policy: CheckpointPolicy,
    name: String,
    created: String,
    /// The last sequence folded.
    covered: u64,
    /// The sequence of the last checkpoint written or restored.
    written: u64,
    /// Events folded since then.
    since: u64,
    last_write: Instant,
    /// The checkpoint being written, with the sequence it covers.
    writing: Option<(u64, Writing)>,
}

impl Fold {
    /// Starts writing a checkpoint when anything was folded since the last
    /// one and none is being written: the state is copied now, encoded and
    /// written beside the fold.
    async fn write(&mut self) {
        if let Some((_, task)) = &self.writing {
            if !task.is_finished() {
                return;
            }
            self.finish_write().await;
        }
        if self.policy.disabled || self.covered <= self.written {
            return;
        }
        self.tracker.resume().await;
        if let Some(why) = self.tracker.lossy() {
            tracing::debug!(reason = %why, "no checkpoint: events not fully counted");
            return;
        }
        let header = Header {
            v: SCHEMA_VERSION,
            format: checkpoint::FORMAT,
            readable_from: Some(checkpoint::READABLE_FROM),
            seq: self.covered,
            stream_created: self.created.clone(),
            written_ms: now_ms(),
            writer: self.name.clone(),
        };
        let t0 = Instant::now();
        let snapshot = checkpoint::Snapshot::of(&self.tracker);
        let copy_ms = t0.elapsed().as_millis() as u64;
        let store = self.store.clone();
        let seq = header.seq;
        self.writing = Some((
            seq,
            tokio::spawn(async move {
                let r = checkpoint::save(store.as_ref(), snapshot, &header).await;
                if let Ok((key, bytes)) = &r {
                    tracing::info!(seq, key = %key, bytes, copy_ms, ms = t0.elapsed().as_millis() as u64,
                        "checkpoint written");
                }
                r
            }),
        ));
        self.since = 0;
        self.last_write = Instant::now();
    }

    /// Waits for the checkpoint being written, if any, and notes it.
    async fn finish_write(&mut self) {
        let Some((seq, task)) = self.writing.take() else {
            return;
        };
        match task.await {
            Ok(Ok(_)) => self.written = self.written.max(seq),
            Ok(Err(e)) => tracing::warn!(seq, error = %e, "checkpoint not written"),
            Err(e) => tracing::warn!(seq, error = %e, "checkpoint writer failed"),
        }
    }
}
