//! The worker's heartbeat: a [`Heartbeat`] on its own subject every interval.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use minions_schemas::messages::Heartbeat;
use minions_schemas::time::now_ms;
use minions_schemas::{SCHEMA_VERSION, encode, subjects};
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;

pub(crate) fn beat(ctx: &Ctx, interval: Duration, started_ms: u64) -> Heartbeat {
    Heartbeat {
        v: SCHEMA_VERSION,
        worker: ctx.worker.clone(),
        host: ctx.host.clone(),
        device: ctx.device.clone(),
        slots: u32::try_from(ctx.slots).unwrap_or(u32::MAX),
        draining: ctx.draining.load(Ordering::Relaxed),
        in_flight: ctx.in_flight(),
        done: ctx.done.load(Ordering::Relaxed),
        failed: ctx.failed.load(Ordering::Relaxed),
        interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
        started_ms,
        at_ms: now_ms(),
    }
}

/// Publishes heartbeats until `stop` is cancelled.
pub(crate) async fn run(
    ctx: Arc<Ctx>,
    interval: Duration,
    started_ms: u64,
    stop: CancellationToken,
) {
    let subject = subjects::heartbeat(&ctx.worker);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        match encode("heartbeat", &beat(&ctx, interval, started_ms)) {
            Ok(bytes) => {
                if let Err(e) = ctx.client.publish(subject.clone(), bytes.into()).await {
                    tracing::warn!(error = %e, "heartbeat not sent");
                }
            }
            Err(e) => tracing::error!(error = %e, "heartbeat does not encode"),
        }
    }
}
