//! This worker's part in a group: a language model split by layers over
//! several workers ([`minions_schemas::messages::GroupOrder`]).
//!
//! - `lead`: the first stage. It holds the embeddings and the first layers,
//!   pulls the group's job alone and runs its shards as any generation
//!   shard runs, through the other stages.
//! - `serve`: a later stage. It holds its layers and their caches and runs
//!   the passes that come, handing them on or, holding the head, sampling
//!   and answering the first stage.
//! - `link`: the first stage's way to the others over NATS.
//!
//! An order with a newer epoch replaces the part held; a release, or an
//! order that does not name this worker, lets it go.

mod lead;
mod link;
mod serve;

use std::sync::Arc;

use futures::StreamExt;
use minions_schemas::messages::{GroupAnswer, GroupOrder, HeldStage};
use minions_schemas::{SCHEMA_VERSION, decode, encode, limits, subjects};
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::group_part::Part;
use crate::model::ModelError;

/// Lets go of the part this worker holds in a group, at once (the owner
/// came back, or an operator evicted it): its layers' memory is freed and
/// the watchdog gives the part to another worker. A leader's running
/// shard ends with it and goes back to the queue, its finished records
/// checkpointed.
pub(crate) fn leave(ctx: &Ctx, why: &str) {
    if let Some(held) = ctx.groups.stage() {
        ctx.groups.replace(None);
        ctx.sched.set_lead(None);
        ctx.sched.set_serving(false);
        tracing::warn!(group = %held.group, stage = held.index, reason = why, "left the group");
    }
}

/// Takes group orders until `stop` is cancelled.
pub(crate) async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let id = ctx.identity.worker_id();
    let mut orders = match ctx.client.subscribe(subjects::group(&id)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for group orders");
            return;
        }
    };
    loop {
        let m = tokio::select! {
            _ = stop.cancelled() => break,
            m = orders.next() => match m {
                Some(m) => m,
                None => break,
            },
        };
        let order: GroupOrder = match decode("group order", &m.payload, limits::MAX_CONTROL_BYTES) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "group order does not decode");
                continue;
            }
        };
        let answer = match take(&ctx, &order).await {
            Ok((detail, weight_bytes)) => (true, detail, weight_bytes),
            Err(e) => {
                tracing::warn!(group = %order.group, epoch = order.epoch, error = %e, "group order refused");
                (false, e.to_string(), 0)
            }
        };
        if let Some(to) = m.reply {
            let a = GroupAnswer {
                v: SCHEMA_VERSION,
                worker: ctx.identity.worker_id(),
                group: order.group.clone(),
                epoch: order.epoch,
                ready: answer.0,
                detail: answer.1,
                weight_bytes: answer.2,
            };
            if let Ok(bytes) = encode("group answer", &a) {
                let _ = ctx.client.publish(to, bytes.into()).await;
            }
        }
    }
    ctx.groups.replace(None);
    ctx.sched.set_lead(None);
    ctx.sched.set_serving(false);
}

/// Carries out `order`; returns what was done and the bytes of the
/// weights held.
async fn take(ctx: &Arc<Ctx>, order: &GroupOrder) -> Result<(String, u64), ModelError> {
    let me = ctx.identity.worker_id();
    if let Some(held) = ctx.groups.stage()
        && held.group == order.group
        && held.epoch > order.epoch
    {
        return Err(ModelError::BadInput(format!(
            "group {} is at epoch {}; the order is for epoch {}",
            held.group, held.epoch, order.epoch
        )));
    }
    let index = order.members.iter().position(|m| m.worker == me);
    let Some(index) = index.filter(|_| !order.release) else {
        let had = ctx.groups.stage().is_some_and(|h| h.group == order.group);
        if had {
            ctx.groups.replace(None);
            ctx.sched.set_lead(None);
            ctx.sched.set_serving(false);
            tracing::info!(group = %order.group, by = %order.by, "group released: layers let go");
        }
        return Ok(("released".into(), 0));
    };
    check_members(order)?;
    let m = &order.members[index];
    let range = m.first_layer as usize..m.end_layer as usize;
    if ctx.groups.regroup(order, index) {
        tracing::info!(group = %order.group, epoch = order.epoch, stage = index, by = %order.by,
            "group re-formed; this stage goes on");
        return Ok((format!("stage {index}: re-formed, layers kept"), 0));
    }
    let pieces = ctx
        .cache
        .stage_pieces(&order.model_hash, range.clone())
        .await?;
    let stop = CancellationToken::new();
    tracing::info!(group = %order.group, epoch = order.epoch, stage = index, layers = ?range,
        job = %order.job, by = %order.by, "joining a group");
    // The old part goes first: its memory is freed before the new loads.
    ctx.groups.replace(None);
    ctx.sched.set_lead(None);
    ctx.sched.set_serving(false);
    let (model, regroup, weight_bytes, pace): (_, crate::group_part::Regroup, _, _) = if index == 0
    {
        let (model, to, pace) = lead::start(ctx, order, pieces, range, stop.clone()).await?;
        let bytes = model.memory_bytes();
        let to = std::sync::Mutex::new(to);
        let regroup = Box::new(move |o: &GroupOrder, _: usize| {
            let to = to.lock().unwrap_or_else(|p| p.into_inner());
            lead::regroup(&to, o);
        });
        (Some(model), regroup, bytes, pace)
    } else {
        let (targets, bytes, pace) =
            serve::start(ctx, order, index, pieces, range, stop.clone()).await?;
        let regroup = Box::new(move |o: &GroupOrder, i: usize| {
            targets.send_replace(serve::Targets::of(o, i));
        });
        (None, regroup, bytes, pace)
    };
    let leads = model.is_some();
    ctx.groups.replace(Some(Part {
        held: HeldStage {
            group: order.group.clone(),
            epoch: order.epoch,
            index: index as u32,
            of: order.members.len() as u32,
            first_layer: m.first_layer,
            end_layer: m.end_layer,
            layer_ns: 0,
        },
        job: order.job.clone(),
        model,
        regroup,
        stop,
        pace,
    }));
    if leads {
        ctx.sched.set_lead(Some(order.job.clone()));
    } else {
        ctx.sched.set_serving(true);
    }
    Ok((
        format!(
            "stage {index} of {}: layers {}..{}",
            order.members.len(),
            m.first_layer,
            m.end_layer
        ),
        weight_bytes,
    ))
}

/// The members' layers run from 0, each range after the one before and
/// none empty; at least two members, none twice.
fn check_members(order: &GroupOrder) -> Result<(), ModelError> {
    let bad = |why: String| ModelError::BadInput(format!("group {}: {why}", order.group));
    if order.members.len() < 2 {
        return Err(bad(format!(
            "{} members; a group has at least 2",
            order.members.len()
        )));
    }
    let mut next = 0;
    for (i, m) in order.members.iter().enumerate() {
        if m.first_layer != next || m.end_layer <= m.first_layer {
            return Err(bad(format!(
                "member {i} holds layers {}..{}; it should begin at {next} and hold at least one",
                m.first_layer, m.end_layer
            )));
        }
        if order.members[..i].iter().any(|o| o.worker == m.worker) {
            return Err(bad(format!("{} is a member twice", m.worker)));
        }
        next = m.end_layer;
    }
    Ok(())
}
