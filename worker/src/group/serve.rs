//! A later stage of a group: its layers and their caches, serving the
//! passes that come on this worker's stage subject. Passes run on a thread
//! of their own, in the order they come; what each makes goes on to the
//! next stage, or, from the last, back to the first. Everything ends, and
//! the layers' memory is freed, when the part's `stop` fires.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use minions_schemas::messages::GroupOrder;
use minions_schemas::subjects;
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::model::ModelError;
use crate::model::llm::llama::Llama;
use crate::model::llm::pace::Pace;
use crate::model::llm::stage::StageServer;
use crate::model::llm::stage_wire::{Outgoing, StageEnd, Taken};
use crate::model::llm::{GgufFile, GgufPieces};

/// Where a stage's output goes: the next stage's subject (the first
/// stage's reply subject from the last), and the first stage's, for
/// refusals.
#[derive(Debug, Clone)]
pub(super) struct Targets {
    next: String,
    back: String,
}

impl Targets {
    /// Stage `index`'s targets in `order`.
    pub(super) fn of(order: &GroupOrder, index: usize) -> Self {
        let back = subjects::stage_back(&order.members[0].worker);
        let next = match order.members.get(index + 1) {
            Some(m) => subjects::stage_in(&m.worker),
            None => back.clone(),
        };
        Self { next, back }
    }
}

/// Loads stage `index` of `order` (layers `range` of the model in `pieces`)
/// and serves it until `stop`; returns the way to point it at new
/// members, the bytes its weights take and how fast it runs its layers.
pub(super) async fn start(
    ctx: &Arc<Ctx>,
    order: &GroupOrder,
    index: usize,
    pieces: GgufPieces,
    range: std::ops::Range<usize>,
    stop: CancellationToken,
) -> Result<(tokio::sync::watch::Sender<Targets>, u64, Arc<Pace>), ModelError> {
    let (device, path) = (ctx.cache.device().clone(), ctx.cache.engine_path());
    let (model, weight_bytes) = tokio::task::spawn_blocking(move || {
        let mut file = GgufFile::open_pieces(&pieces)?;
        let all = file.tensor_bytes();
        let model = Llama::load_stage(&mut file, &device, path, range)?;
        let layers = model.config().layers.max(1) as u64;
        let bytes = all * model.layers().len() as u64 / layers;
        Ok::<_, ModelError>((model, bytes))
    })
    .await
    .map_err(|e| ModelError::Compute(candle_core::Error::Msg(e.to_string())))??;
    let mut end = StageEnd::new(StageServer::new(model, &order.group)?, index);
    let pace = end.pace();
    let (targets, to) = tokio::sync::watch::channel(Targets::of(order, index));
    let lost = |e: &dyn std::fmt::Display| ModelError::StageLost(format!("serving a stage: {e}"));
    let mut passes = ctx
        .client
        .subscribe(subjects::stage_in(&ctx.identity.worker_id()))
        .await
        .map_err(|e| lost(&e))?;
    ctx.client.flush().await.map_err(|e| lost(&e))?;
    let (parts_in, parts) = std::sync::mpsc::channel::<Bytes>();
    let (made, mut out) = tokio::sync::mpsc::unbounded_channel::<Outgoing>();
    let group = order.group.clone();
    std::thread::spawn(move || {
        while let Ok(part) = parts.recv() {
            match end.take(&part) {
                Ok(Taken::Send(o)) => {
                    if made.send(o).is_err() {
                        break;
                    }
                }
                Ok(Taken::Partial) => {}
                Ok(Taken::Dropped(why)) => {
                    tracing::debug!(group = %group, reason = %why, "stale pass dropped")
                }
                Err(e) => {
                    tracing::warn!(group = %group, error = %e, "a pass could not be answered")
                }
            }
        }
    });
    let client = ctx.client.clone();
    let group = order.group.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                m = passes.next() => match m {
                    Some(m) => {
                        if parts_in.send(m.payload).is_err() {
                            break;
                        }
                    }
                    None => break,
                },
                o = out.recv() => {
                    let Some(o) = o else { break };
                    let t = to.borrow().clone();
                    let (subject, list) = match o {
                        Outgoing::Next(p) => (t.next, p),
                        Outgoing::First(p) => (t.back, p),
                    };
                    for p in list {
                        if let Err(e) = client.publish(subject.clone(), p.into()).await {
                            tracing::warn!(group = %group, error = %e, "a stage's output was not sent");
                        }
                    }
                }
            }
        }
        tracing::info!(group = %group, "stage let go");
    });
    Ok((targets, weight_bytes, pace))
}
