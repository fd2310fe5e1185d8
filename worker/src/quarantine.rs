//! Quarantine: the fleet's watchdogs quarantine a machine whose results
//! lose to the majority of check runs too often, by writing its record in
//! the quarantine bucket. The worker reads its machine's record every
//! [`POLL`]; while it says quarantined, the worker hands back what it runs
//! and pulls nothing, until an operator's `minions worker release` rewrites
//! it. A worker cannot lift its own quarantine: its identity may read the
//! bucket, not write it.

use std::sync::Arc;
use std::time::Duration;

use minions_schemas::messages::Quarantine;
use minions_schemas::{decode, limits, streams, subjects};
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;

/// How often the record is read.
const POLL: Duration = Duration::from_secs(1);

/// Follows this machine's quarantine record until `stop` is cancelled.
pub(crate) async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let mut kv = None;
    loop {
        if kv.is_none() {
            kv = ctx.js.get_key_value(streams::QUARANTINE_BUCKET).await.ok();
        }
        if let Some(store) = &kv {
            let machine = subjects::machine(&ctx.identity.worker_id()).to_owned();
            match store.get(&machine).await {
                Ok(Some(bytes)) => {
                    match decode::<Quarantine>(
                        "quarantine record",
                        &bytes,
                        limits::MAX_QUARANTINE_BYTES,
                    ) {
                        Ok(q) if q.quarantined => hold(&ctx, Some(q.reason)),
                        Ok(_) => hold(&ctx, None),
                        Err(e) => {
                            tracing::warn!(error = %e, "this machine's quarantine record does not decode; ignored")
                        }
                    }
                }
                Ok(None) => hold(&ctx, None),
                Err(e) => tracing::debug!(error = %e, "the quarantine bucket could not be read"),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

fn hold(ctx: &Ctx, reason: Option<String>) {
    let quarantined = reason.clone();
    if !ctx.holds.set_quarantine(reason) {
        return;
    }
    match quarantined {
        Some(why) => {
            let n = ctx.running.hand_back_all();
            tracing::error!(reason = %why, handed_back = n,
                "this machine is quarantined: its results disagreed with other machines'; pulling nothing until an operator runs `minions worker release`");
        }
        None => tracing::warn!("quarantine released: pulling again"),
    }
}
