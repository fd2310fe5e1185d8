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

/// How long a worker reading the queue itself waits for the list of
/// consumers before its last schedule stands (a list waits about 4 s, then
/// leaves the job out, while a job consumer's leader is being elected; the
/// watchdog does the same, see `minions_watchdog::schedule`).
const LIST_WAIT: Duration = Duration::from_secs(1);
/// How long the last schedule read stands in for lists that do not come in
/// time.
const LIST_STANDS: Duration = Duration::from_secs(30);

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
    // When this worker's own reading last succeeded.
    let mut own_read: Option<tokio::time::Instant> = None;
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
                // A slow list leaves the last schedule standing (no new
                // one: slots ask again as their empty marks expire), for
                // as long as a watchdog's would stand.
                let standing = own_read.is_some_and(|at| at.elapsed() < LIST_STANDS);
                let read = if standing {
                    tokio::time::timeout(LIST_WAIT, read_own(&ctx.js)).await.ok()
                } else {
                    Some(read_own(&ctx.js).await)
                };
                match read {
                    Some(Ok(s)) => {
                        own_read = Some(tokio::time::Instant::now());
                        ctx.sched.set(s, OWN_READ_EVERY);
                    }
                    Some(Err(e)) => tracing::debug!(error = %e, "cannot read the queue"),
                    None => tracing::debug!("queue list slow (a leader election?); the last schedule stands"),
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
