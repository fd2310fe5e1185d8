//! The watchdog's loop: follow heartbeats, keep the registry, log changes.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use minions_schemas::endpoints::nats;
use minions_schemas::messages::Heartbeat;
use minions_schemas::{decode, limits, streams, subjects};
use tokio_util::sync::CancellationToken;

use crate::registry::{Change, Registry};

/// Why the watchdog could not run.
#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    /// NATS is unreachable, too old, or lacks JetStream.
    #[error(transparent)]
    Nats(#[from] nats::NatsConnectError),
    /// The streams could not be set up.
    #[error(transparent)]
    Streams(#[from] streams::EnsureError),
    /// The heartbeat subscription failed.
    #[error("cannot subscribe to heartbeats: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
}

/// Watchdog settings.
#[derive(Debug, Clone)]
pub struct WatchdogConfig {
    /// NATS server URL.
    pub nats_url: String,
    /// Intervals a worker may miss before it is considered gone.
    pub missed_beats: u32,
}

/// Runs until `shutdown` is cancelled.
pub async fn run(config: WatchdogConfig, shutdown: CancellationToken) -> Result<(), WatchdogError> {
    let client = nats::connect(&config.nats_url, "minions-watchdog").await?;
    let js = jetstream::new(client.clone());
    streams::ensure(&js, &Default::default()).await?;
    let mut beats = client.subscribe(subjects::HEARTBEAT_ALL).await?;
    let mut registry = Registry::new(config.missed_beats);
    let mut sweep = tokio::time::interval(Duration::from_millis(250));
    tracing::info!(nats = %config.nats_url, missed_beats = config.missed_beats, "watchdog started");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            msg = beats.next() => {
                let Some(msg) = msg else { break };
                match decode::<Heartbeat>("heartbeat", &msg.payload, limits::MAX_HEARTBEAT_BYTES) {
                    Ok(hb) if msg.subject.as_str() == subjects::heartbeat(&hb.worker) => {
                        let (host, device) = (hb.host.clone(), hb.device.clone());
                        if let Some(Change::Joined(id)) = registry.beat(hb, Instant::now()) {
                            tracing::info!(worker = %id, host = %host, device = %device, workers = registry.len(), "worker joined");
                        }
                    }
                    Ok(hb) => tracing::warn!(subject = %msg.subject, worker = %hb.worker, "heartbeat on another worker's subject ignored"),
                    Err(e) => tracing::warn!(subject = %msg.subject, error = %e, "heartbeat does not decode"),
                }
            }
            _ = sweep.tick() => {
                for change in registry.sweep(Instant::now()) {
                    if let Change::Lost(id) = change {
                        tracing::warn!(worker = %id, workers = registry.len(), "worker lost (missed heartbeats)");
                    }
                }
            }
        }
    }
    tracing::info!("watchdog stopped");
    Ok(())
}
