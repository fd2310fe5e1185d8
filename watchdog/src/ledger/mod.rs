//! The usage ledger: jobs, shards, deliveries, workers and usage per worker
//! per hour, in PostgreSQL (`--ledger postgres://…`), folded from the events
//! stream so that "who used what, where, at what energy" is a query.
//!
//! The events stream is the source of truth and the ledger a view of it:
//! the watchdog reads the stream from the ledger's cursor (the last stream
//! sequence applied), applies events in batches, each in one transaction
//! that moves the cursor ([`write`]), and on any database error drops the
//! connection, waits and starts again from the cursor. A database that is
//! down stops nothing else; the ledger catches up when it returns, as long
//! as the stream still holds the events (30 days). Several watchdogs may
//! write one ledger: each batch is applied once whoever writes it.
//!
//! Layout: [`migrate`] (schema files in `watchdog/migrations/`), [`plan`]
//! (events to row changes, pure), [`write`] (a batch, once), [`workers`]
//! (what heartbeats say of each worker), [`cancelled`] (jobs cancelled),
//! [`actions`] (operator actions, copied from the actions stream).

mod actions;
mod cancelled;
mod migrate;
mod plan;
mod workers;
mod write;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use minions_schemas::messages::{JobSpec, ShardEvent};
use minions_schemas::{decode, limits, streams};
use object_store::ObjectStore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::view::View;
use minions_endpoints::follow::Follower;

/// Why the ledger could not be written (the watchdog logs it, waits and
/// starts again from the cursor; nothing else stops).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The ledger could not be reached.
    #[error(transparent)]
    Connect(#[from] minions_endpoints::ledger::LedgerConnectError),
    /// PostgreSQL lost the connection, or a statement failed.
    #[error("PostgreSQL: {0}")]
    Pg(#[from] tokio_postgres::Error),
    /// The ledger was migrated by a newer release.
    #[error(
        "the ledger has schema version {found}; this watchdog knows versions up to {known} (upgrade it)"
    )]
    TooNew {
        /// The newest version found in the ledger.
        found: i32,
        /// The newest this build knows.
        known: i32,
    },
    /// The events stream could not be read.
    #[error("{what}: {reason}")]
    Follow {
        /// What could not be read.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A batch does not begin right after the cursor (the reader starts
    /// again from the cursor).
    #[error("events after {cursor} are missing before {next}; reading again from the cursor")]
    Gap {
        /// The ledger's cursor.
        cursor: u64,
        /// The batch's first sequence.
        next: u64,
    },
}

/// How the ledger is written.
#[derive(Debug, Clone)]
pub struct LedgerSettings {
    /// `postgres://user:password@host:port/database` (or key=value form).
    pub url: String,
    /// Most events in one transaction.
    pub batch_max: usize,
    /// Longest an event waits for its batch to fill.
    pub batch_wait: Duration,
    /// How often the workers' rows take what heartbeats say of them.
    pub workers_every: Duration,
}

impl LedgerSettings {
    /// Settings for the ledger at `url`, with the default batching.
    pub fn new(url: String) -> Self {
        Self {
            url,
            batch_max: 1000,
            batch_wait: Duration::from_millis(200),
            workers_every: Duration::from_secs(30),
        }
    }
}

/// What the ledger writer is doing, for metrics and the dashboard.
#[derive(Debug, Default)]
pub struct LedgerStatus {
    /// Connected and migrated.
    pub connected: AtomicBool,
    /// The last stream sequence the ledger holds (by any writer).
    pub cursor: AtomicU64,
    /// The newest stream sequence read.
    pub read: AtomicU64,
    /// Events this watchdog applied.
    pub applied: AtomicU64,
    /// Events found applied already (by another watchdog or before a restart).
    pub skipped: AtomicU64,
}

pub use minions_endpoints::ledger::redact;

/// Starts the ledger writer; it runs until `stop` is cancelled, then writes
/// what it has read and ends.
pub fn start(
    js: jetstream::Context,
    store: Arc<dyn ObjectStore>,
    view: Arc<View>,
    settings: LedgerSettings,
    status: Arc<LedgerStatus>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut writer = Writer {
            js,
            store,
            view,
            settings,
            status,
            specs: HashMap::new(),
        };
        let mut wait = Duration::from_secs(1);
        let mut last_warned: Option<Instant> = None;
        loop {
            match writer.session(&stop).await {
                Ok(()) => break,
                Err(e) => {
                    writer.status.connected.store(false, Ordering::Relaxed);
                    if last_warned.is_none_or(|t| t.elapsed() > Duration::from_secs(30)) {
                        tracing::warn!(ledger = %redact(&writer.settings.url), error = %e,
                            retry_secs = wait.as_secs(), "ledger not written; the events wait in the stream");
                        last_warned = Some(Instant::now());
                    } else {
                        tracing::debug!(error = %e, "ledger not written");
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    })
}

/// The most job specs kept in memory.
const MAX_SPECS: usize = 10_000;

struct Writer {
    js: jetstream::Context,
    store: Arc<dyn ObjectStore>,
    view: Arc<View>,
    settings: LedgerSettings,
    status: Arc<LedgerStatus>,
    specs: HashMap<String, Option<JobSpec>>,
}

fn follow_err<E: std::fmt::Display>(e: E) -> LedgerError {
    LedgerError::Follow {
        what: "the events stream",
        reason: e.to_string(),
    }
}

impl Writer {
    /// One connection's life: connect, migrate, read from the cursor and
    /// write batches until `stop` (Ok) or an error.
    async fn session(&mut self, stop: &CancellationToken) -> Result<(), LedgerError> {
        let mut client =
            minions_endpoints::ledger::connect(&self.settings.url, "minions-watchdog").await?;
        self.follow(&mut client, stop).await
    }

    async fn follow(
        &mut self,
        client: &mut tokio_postgres::Client,
        stop: &CancellationToken,
    ) -> Result<(), LedgerError> {
        migrate::apply(client).await?;
        let mut stream = self
            .js
            .get_stream(streams::EVENTS_STREAM)
            .await
            .map_err(follow_err)?;
        let info = stream.info().await.map_err(follow_err)?;
        let key = format!("{}@{}", streams::EVENTS_STREAM, info.created);
        let mut cursor = write::cursor(client, &key).await?;
        let first = info.state.first_sequence;
        if first > cursor + 1 && info.state.messages > 0 {
            tracing::warn!(
                cursor,
                first_in_stream = first,
                "events after the ledger's cursor left the stream before the ledger read them; they are not in the ledger"
            );
            write::advance(client, &key, first - 1).await?;
            cursor = first - 1;
        }
        self.status.cursor.store(cursor, Ordering::Relaxed);
        self.status.connected.store(true, Ordering::Relaxed);
        tracing::info!(ledger = %redact(&self.settings.url), cursor,
            stream_last_seq = info.state.last_sequence, "ledger connected");
        let mut follower = Follower::start(&self.js, cursor)
            .await
            .map_err(follow_err)?;
        workers::upsert(client, &self.view).await?;
        actions::copy(client, &self.js).await?;
        let mut workers_tick = tokio::time::interval(self.settings.workers_every);
        workers_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Batch::default();
        let mut deadline = tokio::time::Instant::now();
        loop {
            let flush_due = batch.first.is_some();
            tokio::select! {
                _ = stop.cancelled() => {
                    self.flush(client, &key, &mut batch).await?;
                    return Ok(());
                }
                _ = tokio::time::sleep_until(deadline), if flush_due => {
                    self.flush(client, &key, &mut batch).await?;
                }
                _ = workers_tick.tick() => {
                    workers::upsert(client, &self.view).await?;
                    cancelled::mark(client, &self.view).await?;
                    actions::copy(client, &self.js).await?;
                }
                m = follower.next() => {
                    let (seq, m) = match m {
                        Some(Ok(r)) => (r.seq, r.message),
                        Some(Err(e)) => return Err(follow_err(e)),
                        None => return Err(follow_err("the stream's consumer ended")),
                    };
                    self.status.read.store(seq, Ordering::Relaxed);
                    // A message that is not a valid event (or a forged one)
                    // is skipped; its sequence is covered all the same.
                    let event = decode::<ShardEvent>("shard event", &m.payload, limits::MAX_EVENT_BYTES)
                        .ok()
                        .filter(|e| e.is_on(&m.subject));
                    if batch.first.is_none() {
                        batch.first = Some(seq);
                        deadline = tokio::time::Instant::now() + self.settings.batch_wait;
                    }
                    batch.last = seq;
                    if let Some(e) = event {
                        batch.events.push((seq, e));
                    }
                    // A batch is written when full or `batch_wait` after its
                    // first message, not per message: each write is a
                    // handful of statements whatever its size.
                    if batch.events.len() >= self.settings.batch_max {
                        self.flush(client, &key, &mut batch).await?;
                    }
                }
            }
        }
    }

    /// Writes the batch (its jobs' specs read first, outside the
    /// transaction) and empties it.
    async fn flush(
        &mut self,
        client: &mut tokio_postgres::Client,
        key: &str,
        batch: &mut Batch,
    ) -> Result<(), LedgerError> {
        let Some(first) = batch.first else {
            return Ok(());
        };
        if self.specs.len() > MAX_SPECS {
            self.specs.clear();
        }
        for (_, e) in &batch.events {
            if !self.specs.contains_key(e.job.as_str()) {
                let spec = crate::orphans::read_spec(self.store.as_ref(), &e.job).await;
                self.specs.insert(e.job.as_str().to_owned(), spec);
            }
        }
        let w = write::batch(client, key, (first, batch.last), &batch.events, &self.specs).await?;
        self.status.cursor.store(w.cursor, Ordering::Relaxed);
        self.status
            .applied
            .fetch_add(w.applied as u64, Ordering::Relaxed);
        self.status
            .skipped
            .fetch_add(w.skipped as u64, Ordering::Relaxed);
        tracing::debug!(
            applied = w.applied,
            skipped = w.skipped,
            cursor = w.cursor,
            "ledger batch written"
        );
        *batch = Batch::default();
        Ok(())
    }
}

/// Messages read and not yet written: the sequences they cover and the
/// valid events among them.
#[derive(Default)]
struct Batch {
    first: Option<u64>,
    last: u64,
    events: Vec<(u64, ShardEvent)>,
}
