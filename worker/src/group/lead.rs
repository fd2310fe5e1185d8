//! The first stage of a group: the tokenizer, the embeddings and the first
//! layers, and the generation loop that drives the others
//! ([`crate::model::llm::pipeline`]). To the shard runner it is a model
//! like any other: a shard of the group's job runs on it, checkpoints and
//! acks as a shard on one worker does.
//!
//! When a stage is lost or refuses a pass, the epoch ends: every stage's
//! caches go, and the records not finished run again from their prompts
//! (finished ones were handed on already), drawing the same tokens from
//! their seeds.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use minions_schemas::messages::{Generation, GenerationRecord, GroupOrder, ModelFamily};
use minions_schemas::subjects;
use tokio_util::sync::CancellationToken;

use super::link::{LinkMsg, NatsLink};
use crate::context::Ctx;
use crate::model::llm::pace::Pace;
use crate::model::llm::pipeline::{Split, generate_split};
use crate::model::llm::{GenControl, GenLimits, GgufGenerator, GgufPieces};
use crate::model::{Model, ModelError};

/// Runs of the records left in the same group, each in a new epoch, before
/// the first stage waits for the group to be re-formed.
const RUNS: usize = 2;

/// How long the first stage waits for a lost member's replacement before
/// it hands the shard back (to run when a group forms again).
pub(crate) const REFORM_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Epochs the first stage may begin within one of the watchdog's: frames
/// carry `order epoch << EPOCH_BITS | restarts`.
const EPOCH_BITS: u32 = 16;

/// The first stage as a model.
struct SplitGenerator {
    generator: GgufGenerator,
    run: Mutex<(Split, NatsLink)>,
}

/// Loads the first stage for `order` (layers `range` of the model in
/// `pieces`) and opens its link; the link's listener ends with `stop`.
/// Returns the model, the way to tell it of a re-formed group
/// ([`regroup`]) and how fast it runs its layers.
pub(super) async fn start(
    ctx: &Arc<Ctx>,
    order: &GroupOrder,
    pieces: GgufPieces,
    range: std::ops::Range<usize>,
    stop: CancellationToken,
) -> Result<(Arc<dyn Model>, std::sync::mpsc::Sender<LinkMsg>, Arc<Pace>), ModelError> {
    let (device, path) = (ctx.cache.device().clone(), ctx.cache.engine_path());
    let generator = tokio::task::spawn_blocking(move || {
        GgufGenerator::load_stage_pieces(&pieces, &device, path, range)
    })
    .await
    .map_err(|e| ModelError::Compute(candle_core::Error::Msg(e.to_string())))??;
    let layers = generator.model().config().layers as u32;
    let last = order.members.last().map_or(0, |m| m.end_layer);
    if last != layers {
        return Err(ModelError::BadInput(format!(
            "group {}: the members hold layers up to {last}; the model has {layers}",
            order.group
        )));
    }
    let next = subjects::stage_in(&order.members[1].worker);
    let back = subjects::stage_back(&ctx.identity.worker_id());
    let (link, regroup) = NatsLink::open(ctx.client.clone(), next, back, stop).await?;
    let widest = order
        .members
        .iter()
        .map(|m| (m.end_layer - m.first_layer) as usize)
        .max()
        .unwrap_or(1);
    // Two micro-batch groups per stage: with one per stage a stage waits
    // whenever the next is a little slower (BENCHMARKS.md, "A model split
    // over two processes").
    let split = Split::new(
        &order.group,
        order.epoch << EPOCH_BITS,
        2 * order.members.len(),
        widest,
    );
    let pace = split.pace.clone();
    let model: Arc<dyn Model> = Arc::new(SplitGenerator {
        generator,
        run: Mutex::new((split, link)),
    });
    Ok((model, regroup, pace))
}

/// Tells a first stage's generation loop that its group was re-formed as
/// `order` (a lost member replaced): the epoch in flight ends, and the
/// records left run again through the new members.
pub(super) fn regroup(to: &std::sync::mpsc::Sender<LinkMsg>, order: &GroupOrder) {
    if let Some(second) = order.members.get(1) {
        let _ = to.send(LinkMsg::Regroup {
            epoch: order.epoch << EPOCH_BITS,
            next: subjects::stage_in(&second.worker),
        });
    }
}

impl Model for SplitGenerator {
    fn family(&self) -> ModelFamily {
        ModelFamily::LlmGeneration
    }

    fn generate(
        &self,
        records: &[(usize, &GenerationRecord)],
        limits: GenLimits,
        control: &GenControl,
        done: &mut dyn FnMut(usize, Generation),
    ) -> Result<(), ModelError> {
        let work = self.generator.prepare_all(records, done)?;
        let mut held = self.run.lock().unwrap_or_else(|p| p.into_inner());
        let (split, link) = &mut *held;
        let mut finished = HashSet::new();
        let mut failures = 0;
        loop {
            let todo: Vec<_> = work
                .iter()
                .filter(|p| !finished.contains(&p.index))
                .cloned()
                .collect();
            let r = generate_split(
                self.generator.model(),
                self.generator.tokenizer(),
                todo,
                limits,
                split,
                control,
                link,
                &mut |i, g| {
                    finished.insert(i);
                    done(i, g);
                },
            );
            match r {
                Ok(()) => return Ok(()),
                Err(ModelError::StageLost(why)) if link.closed() => {
                    // Released: the shard goes back to the queue.
                    return Err(ModelError::StageLost(why));
                }
                Err(ModelError::StageLost(why)) => {
                    failures += 1;
                    tracing::warn!(group = %split.group, epoch = split.epoch, finished = finished.len(),
                        in_flight = split.in_flight, left = work.len() - finished.len(), reason = %why,
                        "the group's epoch ended; the records left run again from their prompts");
                    // A re-formed group goes on at once; a failure in the
                    // same group is tried again, then waits for one.
                    let wait = if failures >= RUNS {
                        REFORM_WAIT
                    } else {
                        std::time::Duration::ZERO
                    };
                    match link.regrouped(wait, &control.stop) {
                        Some(epoch) => {
                            split.begin(epoch);
                            failures = 0;
                        }
                        None if failures >= RUNS => return Err(ModelError::StageLost(why)),
                        None => split.restart(),
                    }
                    if control.stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn memory_bytes(&self) -> u64 {
        self.generator.weight_bytes()
    }
}
