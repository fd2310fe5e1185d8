//! Feeding the worker's [`Scheduler`](crate::schedule::Scheduler): the
//! watchdog's schedule as it arrives (with preemption), or, while no
//! watchdog publishes, the queue read by this worker once a second and at
//! once on a submit's nudge.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use minions_schemas::messages::Schedule;
use minions_schemas::scheduling;
use minions_schemas::time::now_ms;
use minions_schemas::{limits, subjects};
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::schedule::OWN_READ_EVERY;

/// After this long without a watchdog's schedule, a worker reads the queue
/// itself.
const WATCHDOG_SILENCE: Duration = Duration::from_secs(2);

/// Follows the watchdog's schedule until `stop`; reads the queue itself
/// while none arrives.
pub(crate) async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let mut sub = match ctx.client.subscribe(subjects::SCHEDULE).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot follow the schedule; reading the queue directly");
            None
        }
    };
    // A submit's nudge: with no watchdog to follow, the queue is read at
    // once, so a new job starts without waiting for the tick.
    let mut queued = minions_endpoints::queue::Nudges::follow(&ctx.client).await;
    let mut last_remote = tokio::time::Instant::now() - WATCHDOG_SILENCE;
    let mut own = tokio::time::interval(OWN_READ_EVERY);
    own.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A slow list while a consumer's leader is elected: the last stands.
    let mut listed = minions_endpoints::queue::Standing::default();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            msg = async {
                match sub.as_mut() {
                    Some(s) => s.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let Some(msg) = msg else { sub = None; continue };
                match minions_schemas::decode::<Schedule>("schedule", &msg.payload, limits::MAX_SCHEDULE_BYTES) {
                    Ok(s) => {
                        let now = tokio::time::Instant::now();
                        let gap = now.duration_since(last_remote).min(OWN_READ_EVERY);
                        last_remote = now;
                        ctx.sched.preempt(&s, ctx.cache.held(), &ctx.running);
                        ctx.sched.set(s, gap);
                    }
                    Err(e) => tracing::warn!(error = %e, "ignoring a schedule that does not decode"),
                }
            }
            () = queued.next() => {
                // The watchdog, where one publishes, answers the nudge.
                if last_remote.elapsed() >= WATCHDOG_SILENCE {
                    own.reset_immediately();
                }
            }
            _ = own.tick() => {
                if last_remote.elapsed() < WATCHDOG_SILENCE {
                    continue;
                }
                // A slow list leaves the last schedule standing (slots
                // ask again as their empty marks expire).
                use minions_endpoints::queue::Reading;
                match listed.read(read_own(&ctx.js)).await {
                    Reading::Fresh(s) => ctx.sched.set(s, OWN_READ_EVERY),
                    Reading::Stands(_) => tracing::debug!("queue list slow (a leader election?); the last schedule stands"),
                    Reading::Failed(e) => tracing::debug!(error = %e, "cannot read the queue"),
                }
            }
        }
    }
}

/// A schedule read straight from the queue (no usage history).
async fn read_own(
    js: &jetstream::Context,
) -> Result<Schedule, minions_endpoints::queue::ScheduleError> {
    let jobs = minions_endpoints::queue::list_jobs(js).await?;
    let teams = match minions_endpoints::queue::read_teams(js).await {
        Ok((t, _)) => t,
        Err(e) => {
            tracing::debug!(error = %e, "team policies unreadable; teams share equally");
            Default::default()
        }
    };
    Ok(scheduling::build(now_ms(), jobs, &teams, &HashMap::new()))
}
