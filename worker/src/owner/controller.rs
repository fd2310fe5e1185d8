//! Applies the policy: reads the signals every period, and on a yield stops
//! pulling, hands back running shards (all but those about to finish) and
//! releases the models; on a resume pulls again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::policy::{Change, Gate, Policy};
use super::signal::{Observation, Source};
use crate::context::Ctx;

/// Reads every source and merges what they say; failures are logged once
/// per source until it recovers.
async fn observe(sources: &[Source], failing: &mut [bool]) -> Observation {
    let mut o = Observation::default();
    for (i, s) in sources.iter().enumerate() {
        match s.sample().await {
            Ok(x) => {
                if failing[i] {
                    tracing::info!(signal = %s, "owner signal readable again");
                    failing[i] = false;
                }
                o.merge(x);
            }
            Err(e) => {
                if !failing[i] {
                    tracing::warn!(signal = %s, error = %e, "owner signal unreadable; ignoring it");
                    failing[i] = true;
                }
            }
        }
    }
    o
}

/// Runs the owner policy until `stop` is cancelled.
pub(crate) async fn run(ctx: Arc<Ctx>, policy: Policy, stop: CancellationToken) {
    let sources: Vec<Source> = policy
        .signals
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    let mut failing = vec![false; sources.len()];
    let mut gate = Gate::new(Duration::from_secs_f64(policy.resume_after_secs.max(0.0)));
    let finish_within = Duration::from_secs_f64(policy.finish_within_secs.max(0.0));
    let mut tick = tokio::time::interval(Duration::from_millis(policy.sample_every_ms.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Not lent until the first reading says so.
    ctx.holds
        .set_owner(Some("waiting for the first owner reading".to_owned()));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut o = observe(&sources, &mut failing).await;
        o.local_hour = Some(chrono::Timelike::hour(&chrono::Local::now()));
        let verdict = policy.check(&o);
        match gate.update(&verdict, Instant::now()) {
            Some(Change::Yield(reason)) => {
                ctx.holds.set_owner(Some(reason.clone()));
                crate::group::leave(&ctx, &reason);
                let n = ctx.running.hand_back_unless_finishing(finish_within);
                ctx.cache.release();
                tracing::warn!(reason = %reason, handed_back = n, "yielding to the owner: pulling nothing, shards handed back, models released");
            }
            Some(Change::Resume) => {
                ctx.holds.set_owner(None);
                tracing::info!("owner away: lending the GPU");
            }
            None => {
                if !gate.lending()
                    && let Err(reason) = verdict
                {
                    ctx.holds.set_owner(Some(reason));
                }
            }
        }
    }
}
