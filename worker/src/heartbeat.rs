//! The worker's heartbeat: a [`Heartbeat`] on its own subject every interval
//! (the heartbeat stream keeps the last one), and a last one when it leaves.

use std::sync::Arc;
use std::time::Duration;

use minions_schemas::messages::Heartbeat;
use minions_schemas::time::now_ms;
use minions_schemas::{SCHEMA_VERSION, encode, subjects};
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;

/// Total and available memory in MB, where the platform tells (Linux).
pub(crate) fn memory_mb() -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return (0, 0);
    };
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// Builds a beat; `mem` is (total, available) MB as last read.
pub(crate) fn beat(
    ctx: &Ctx,
    interval: Duration,
    started_ms: u64,
    leaving: bool,
    (mem_total_mb, mem_avail_mb): (u64, u64),
) -> Heartbeat {
    Heartbeat {
        power: ctx.energy.reading(),
        chip: ctx.identity.chip.clone(),
        build: ctx.identity.made_by.build.clone(),
        kernel: ctx.identity.made_by.kernel.clone(),
        stage: ctx.groups.stage(),
        lend_mb: ctx.sched.lend_mb,
        v: SCHEMA_VERSION,
        worker: ctx.identity.worker_id(),
        host: ctx.identity.host.clone(),
        device: ctx.identity.device.clone(),
        slots: u32::try_from(ctx.settings.slots).unwrap_or(u32::MAX),
        holds: u32::try_from(ctx.settings.slots.max(ctx.settings.generation.max_shards))
            .unwrap_or(u32::MAX),
        draining: ctx.holds.draining(),
        leaving,
        owner: ctx.holds.owner_state(),
        mem_total_mb,
        mem_avail_mb,
        mem_budget_mb: ctx.settings.mem_budget_mb,
        in_flight: if leaving {
            Vec::new()
        } else {
            ctx.running.in_flight()
        },
        done: ctx.running.done(),
        failed: ctx.running.failed(),
        interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
        started_ms,
        at_ms: now_ms(),
    }
}

/// Publishes the leaving heartbeat (with this moment's memory figures),
/// then flushes, so that the watchdog sees the worker go before the
/// connection closes; a failed flush is logged.
pub(crate) async fn send_leaving(ctx: &Ctx, interval: Duration, started_ms: u64) {
    send(ctx, interval, started_ms, true, memory_mb()).await;
    if let Err(e) = ctx.client.flush().await {
        tracing::warn!(error = %e, "final flush to NATS failed");
    }
}

/// Publishes one heartbeat with memory figures `mem` (see [`beat`]).
pub(crate) async fn send(
    ctx: &Ctx,
    interval: Duration,
    started_ms: u64,
    leaving: bool,
    mem: (u64, u64),
) {
    let hb = beat(ctx, interval, started_ms, leaving, mem);
    let subject = subjects::heartbeat(&hb.worker);
    match encode("heartbeat", &hb) {
        Ok(bytes) => {
            if let Err(e) = ctx.client.publish(subject, bytes.into()).await {
                tracing::warn!(error = %e, "heartbeat not sent");
            }
        }
        Err(e) => tracing::error!(error = %e, "heartbeat does not encode"),
    }
}

/// How long a finished shard's beat waits for another beat to carry it.
pub(crate) const FINISH_BEAT_DELAY: Duration = Duration::from_millis(25);

/// Publishes heartbeats until `stop` is cancelled, the first one `interval`
/// after the start (the worker sent one when it checked its identity): every `interval`, and at
/// once when a shard starts, so the watchdog knows every delivery this
/// worker holds before work on it begins (a worker killed between taking a
/// shard and this beat leaves it to the ack wait; the window is the time to
/// publish one small message); and [`FINISH_BEAT_DELAY`] after a shard
/// finishes unless another beat went out meanwhile. Beats never outnumber
/// shard starts plus intervals plus finishes: notifications coalesce.
pub(crate) async fn run(
    ctx: Arc<Ctx>,
    interval: Duration,
    started_ms: u64,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first beat was sent when the worker checked its identity.
    tick.reset();
    let mut mem = memory_mb();
    // When a finished shard's beat is due, if no other beat goes out first.
    let mut finish_due: Option<tokio::time::Instant> = None;
    loop {
        let finish_beat = async {
            match finish_due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            // Memory is read on the periodic beat only: beats on shard
            // starts sit on the hot path and reuse the last reading.
            _ = tick.tick() => mem = memory_mb(),
            _ = ctx.beats.asked_now() => tick.reset(),
            _ = finish_beat => tick.reset(),
            _ = ctx.beats.asked_soon() => {
                finish_due.get_or_insert(tokio::time::Instant::now() + FINISH_BEAT_DELAY);
                continue;
            }
        }
        finish_due = None;
        send(&ctx, interval, started_ms, false, mem).await;
    }
}
