//! Running a generation shard: continuous batching on the device, results
//! checkpointed to the store as they finish, so a redelivery (after a crash,
//! an eviction or the owner's return) resumes instead of starting over.
//!
//! The shard's records run in the worker's running batch, which shards of
//! the same model share ([`crate::shared_run`]); each finished record comes
//! back over a channel. This side keeps the results, writes a checkpoint every
//! [`GenSettings::checkpoint_every`] (and once more when the shard is handed
//! back), and publishes a progress event with each checkpoint. A record's
//! result depends on the record alone (greedy, or seeded per record), so
//! records taken from a checkpoint and records computed again agree.

use std::sync::Arc;
use std::time::Instant;

use minions_schemas::messages::{
    EventKind, Generation, GenerationRecord, OutputPayload, ShardCheckpoint, ShardInput, ShardTask,
};
use minions_schemas::{SCHEMA_VERSION, decode, encode, limits};
use object_store::path::Path as StorePath;
use object_store::{ObjectStoreExt, PutPayload};

use crate::context::Ctx;
use crate::error::ShardError;
use crate::model::Model;
use crate::model::llm::GenLimits;
use crate::running::Stops;
use crate::shared_run::{Arrived, Claim};

pub use crate::settings::GenSettings;

/// What a generation run produced.
pub(crate) struct Generated {
    pub(crate) payload: OutputPayload,
    pub(crate) compute_ms: u64,
    /// Tokens generated for the shard's records (checkpointed ones included).
    pub(crate) tokens: u64,
}

/// Runs `input`'s records on `model`, resuming from the shard's checkpoint:
/// in the running batch of the same model when there is one that takes
/// shards ([`crate::shared_run`]), else in a run of its own once the
/// device is free. Returns `Stopping` or `Cancelled` when `hand_back` or
/// `cancel` fires, after checkpointing what is finished.
pub(crate) async fn run(
    ctx: &Ctx,
    task: &ShardTask,
    attempt: u64,
    model: Arc<dyn Model>,
    input: ShardInput,
    stops: &Stops,
    claim: Option<Claim>,
) -> Result<Generated, ShardError> {
    let Stops { hand_back, cancel } = stops;
    let n = input.records.len();
    let mut results: Vec<Option<Generation>> = vec![None; n];
    let resumed = resume(ctx, task, &mut results).await;
    if resumed > 0 {
        tracing::info!(job = %task.job, shard = task.shard, attempt, records = resumed, of = n,
            "resuming from checkpoint");
    }
    let todo: Vec<(usize, GenerationRecord)> = input
        .records
        .into_iter()
        .enumerate()
        .filter(|(i, _)| results[*i].is_none())
        .collect();
    let started = Instant::now();
    let settings = &ctx.settings.generation;
    let mut stop: Option<ShardError> = None;
    let mut ended: Result<(), ShardError> = Ok(());
    let mut unsaved = 0usize;
    // Nothing to run when every record came from the checkpoint.
    if !todo.is_empty() {
        let joined = ctx.runs.join(&task.model_hash, todo);
        // A join slot's next pull may start once this shard joined (or not).
        drop(claim);
        let mut member = match joined {
            Ok(m) => {
                tracing::debug!(job = %task.job, shard = task.shard, "joined the running batch");
                m
            }
            Err(todo) => {
                let permit = tokio::select! {
                    p = ctx.runs.waiting_for_device(ctx.compute.clone().acquire_owned()) =>
                        p.map_err(|_| ShardError::Stopping)?,
                    _ = hand_back.cancelled() => return Err(ShardError::Stopping),
                    _ = cancel.cancelled() => return Err(ShardError::Cancelled),
                };
                let limits = GenLimits {
                    max_seqs: settings.max_seqs,
                    kv_budget_bytes: settings.kv_budget_bytes,
                    ..GenLimits::default()
                };
                ctx.runs.start(
                    task.model_hash.clone(),
                    model,
                    todo,
                    limits,
                    settings.max_shards,
                    permit,
                )
            }
        };
        let mut tick = tokio::time::interval(settings.checkpoint_every);
        tick.tick().await;
        loop {
            tokio::select! {
                got = member.rx.recv() => match got {
                    Some(Arrived::Done(i, g)) => {
                        tracing::debug!(job = %task.job, shard = task.shard, record = i, "record finished");
                        if i < n && results[i].is_none() {
                            results[i] = Some(g);
                            unsaved += 1;
                        }
                    }
                    Some(Arrived::Out) | None => break,
                    Some(Arrived::Ended(r)) => {
                        ended = r;
                        break;
                    }
                },
                _ = tick.tick() => {
                    if unsaved > 0 {
                        save(ctx, task, &results).await;
                        unsaved = 0;
                    }
                    progress(ctx, task, attempt, &results).await;
                }
                _ = hand_back.cancelled(), if stop.is_none() => {
                    member.leave();
                    stop = Some(ShardError::Stopping);
                }
                _ = cancel.cancelled(), if stop.is_none() => {
                    member.leave();
                    stop = Some(ShardError::Cancelled);
                }
            }
        }
        drop(member);
    }
    let compute_ms = started.elapsed().as_millis() as u64;
    if let Some(stop) = stop {
        if unsaved > 0 && matches!(stop, ShardError::Stopping) {
            save(ctx, task, &results).await;
        }
        return Err(stop);
    }
    if let Err(e) = ended {
        // What finished is kept for the next delivery.
        if unsaved > 0 {
            save(ctx, task, &results).await;
        }
        return Err(e);
    }
    let records: Vec<Generation> = results
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            g.ok_or_else(|| ShardError::Transient(format!("record {i} of the shard got no result")))
        })
        .collect::<Result<_, _>>()?;
    let tokens = records.iter().map(|g| u64::from(g.completion_tokens)).sum();
    tracing::info!(job = %task.job, shard = task.shard, records = n, resumed,
        recomputed = n - resumed, tokens, compute_ms, "generation shard finished");
    Ok(Generated {
        payload: OutputPayload::Generations { records },
        compute_ms,
        tokens,
    })
}

/// Fills `results` from the shard's checkpoint; returns how many records it
/// held.
async fn resume(ctx: &Ctx, task: &ShardTask, results: &mut [Option<Generation>]) -> usize {
    let Some(cp) = read_checkpoint(ctx, task).await else {
        return 0;
    };
    let mut taken = 0;
    for (i, g) in cp.done {
        if let Some(slot) = results.get_mut(i as usize)
            && slot.is_none()
        {
            *slot = Some(g);
            taken += 1;
        }
    }
    taken
}

/// The shard's checkpoint, when there is one of this run (same job, shard,
/// model and size). A missing, damaged or foreign checkpoint is ignored
/// (the shard starts over), never an error.
pub(crate) async fn read_checkpoint(ctx: &Ctx, task: &ShardTask) -> Option<ShardCheckpoint> {
    let key = StorePath::from(task.checkpoint_key());
    let got = match ctx.store.get(&key).await {
        Ok(g) if g.meta.size <= limits::MAX_SHARD_OUTPUT_BYTES as u64 => g,
        Ok(_) => return None,
        Err(object_store::Error::NotFound { .. }) => return None,
        Err(e) => {
            tracing::warn!(job = %task.job, shard = task.shard, error = %e, "checkpoint not read; starting over");
            return None;
        }
    };
    let bytes = got.bytes().await.ok()?;
    let cp: ShardCheckpoint = match decode(
        "shard checkpoint",
        &bytes,
        limits::MAX_SHARD_OUTPUT_BYTES,
    ) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(job = %task.job, shard = task.shard, error = %e, "checkpoint damaged; starting over");
            return None;
        }
    };
    if cp.job != task.job
        || cp.shard != task.shard
        || cp.model_hash != task.model_hash
        || cp.rows != u64::from(task.rows)
    {
        tracing::warn!(job = %task.job, shard = task.shard, "checkpoint belongs to another run; starting over");
        return None;
    }
    Some(cp)
}

/// Writes the finished records as the shard's checkpoint (best effort: a
/// failed write only means more work on a redelivery).
async fn save(ctx: &Ctx, task: &ShardTask, results: &[Option<Generation>]) {
    let cp = ShardCheckpoint {
        v: SCHEMA_VERSION,
        job: task.job.clone(),
        shard: task.shard,
        rows: u64::from(task.rows),
        model_hash: task.model_hash.clone(),
        done: results
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.clone().map(|g| (i as u32, g)))
            .collect(),
        transcripts: Vec::new(),
        partial: Vec::new(),
    };
    write_checkpoint(ctx, task, &cp).await;
}

/// Writes `cp` as the shard's checkpoint, overwriting the last (best
/// effort: a failed write only means more work on a redelivery).
pub(crate) async fn write_checkpoint(ctx: &Ctx, task: &ShardTask, cp: &ShardCheckpoint) {
    let (records, files, partial) = (cp.done.len(), cp.transcripts.len(), cp.partial.len());
    let bytes = match encode("shard checkpoint", cp) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "checkpoint does not encode");
            return;
        }
    };
    let key = StorePath::from(task.checkpoint_key());
    match ctx.store.put(&key, PutPayload::from(bytes)).await {
        Ok(_) => tracing::info!(job = %task.job, shard = task.shard, records, files, partial,
            "checkpoint written"),
        Err(e) => {
            tracing::warn!(job = %task.job, shard = task.shard, error = %e, "checkpoint not written")
        }
    }
}

/// Publishes the shard's progress (records finished, and the tokens they
/// generated: the shard shares its batch, so tokens of records still
/// running are not told apart).
async fn progress(ctx: &Ctx, task: &ShardTask, attempt: u64, results: &[Option<Generation>]) {
    let done = results.iter().flatten();
    let kind = EventKind::Progress {
        records: done.clone().count() as u64,
        tokens: done.map(|g| u64::from(g.completion_tokens)).sum(),
        audio_ms: 0,
    };
    crate::events::publish_event(ctx, task, attempt, kind, false).await;
}

/// Removes a finished shard's checkpoint (its output holds everything now).
pub(crate) async fn forget(ctx: &Ctx, task: &ShardTask) {
    let key = StorePath::from(task.checkpoint_key());
    match ctx.store.delete(&key).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => tracing::debug!(error = %e, "checkpoint not removed"),
    }
}
