//! One shard delivery, from message to settlement.
//!
//! Order of effects (the shard lifecycle): decode the task (undecodable →
//! terminate), publish `started`, keep the delivery alive with in-progress
//! acks, on a redelivery skip the work if the output already exists, fetch
//! model and input, compute, write the output create-only ("already exists" = an earlier
//! delivery finished it: verify and ack), publish `done` and wait for the
//! stream to store it, then ack and wait for the server to confirm.

use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream::{AckKind, Message};
use bytes::Bytes;
use minions_schemas::messages::{
    Energy, EventKind, InFlight, ModelFamily, ShardInput, ShardOutput, ShardTask,
};
use minions_schemas::time::now_ms;
use minions_schemas::{SCHEMA_VERSION, decode, encode, keys, limits, subjects};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::error::{Settle, ShardError, backoff};
use crate::events::{publish, publish_event};
use crate::model::Batching;
use crate::running::Stops;

/// What a successful run produced.
struct Done {
    rows: u64,
    /// Tokens generated (generation shards).
    tokens: u64,
    /// Milliseconds of audio (speech shards).
    audio_ms: u64,
    sha256: String,
    output_bytes: u64,
    compute_ms: u64,
    already_done: bool,
    /// What made the output (this worker, or the one whose output a
    /// redelivery found).
    made_by: Option<minions_schemas::messages::Provenance>,
}

/// What [`handle`] leaves behind when it returns.
pub(crate) struct Handled {
    /// Milliseconds the device was busy with the shard.
    pub busy_ms: u64,
    /// A finished shard's settlement (store the `done` event, then ack),
    /// still running: its output is written, so the slot may pull the next
    /// shard meanwhile. Awaiting it is what makes the shard acked.
    pub settling: Option<JoinHandle<()>>,
    /// A check run this machine must not run, handed back unrun.
    pub avoided: bool,
    /// How long the slot rests before it pulls again: set when this machine
    /// is too small for the shard's model, so a larger one takes it.
    pub rest: Option<std::time::Duration>,
}

/// How long past a refused shard's return the refusing slot rests.
const WRONG_MACHINE_REST: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest a slot rests after refusing a shard too large for it.
const MAX_WRONG_MACHINE_REST: std::time::Duration = std::time::Duration::from_secs(31);

/// How long a check run of this machine's own result stays away after it
/// is handed back, at least (up to 200 ms more, at random).
const AVOIDED_NAK: std::time::Duration = std::time::Duration::from_millis(50);

/// Handles one delivery: runs it unless it is handed back or its job
/// cancelled first, then settles it (ack, nak or term) and reports it. A
/// failure is settled before this returns; a success's settlement is handed
/// back in [`Handled::settling`] so that the next pull overlaps it.
/// `claim`, for a join slot's pull, is released once the shard has joined
/// the running batch (or cannot).
pub(crate) async fn handle(
    ctx: &Arc<Ctx>,
    msg: Message,
    claim: Option<crate::shared_run::Claim>,
) -> Handled {
    let (attempt, seq) = match msg.info() {
        Ok(i) => (u64::try_from(i.delivered).unwrap_or(1), i.stream_sequence),
        Err(_) => (1, 0),
    };
    let task: ShardTask = match decode("shard task", &msg.payload, limits::MAX_TASK_BYTES) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(subject = %msg.subject, stream_seq = seq, error = %e,
                "shard message does not decode; terminated");
            term(ctx, &msg, &e.to_string()).await;
            ctx.running.count_failed();
            return Handled::nothing();
        }
    };
    let routed = msg.subject.as_str() == subjects::work(&task.job, task.shard)
        || (task.check > 0 && msg.subject.as_str() == subjects::check_work(&task.job, task.shard));
    if !routed {
        let reason = format!(
            "shard message for job {} shard {} arrived on subject {}; terminated",
            task.job, task.shard, msg.subject
        );
        tracing::error!(stream_seq = seq, reason = %reason, "forged or misrouted shard");
        term(ctx, &msg, &reason).await;
        ctx.running.count_failed();
        return Handled::nothing();
    }
    let me = ctx.identity.worker_id();
    if !task.may_run_on(subjects::machine(&me)) {
        // A check run of a shard this machine ran: another machine takes it.
        // It stays away for a moment (so that this slot's next pull gets
        // other work), a random one: machines that hand back each other's
        // check runs would otherwise meet them again in step.
        let jitter = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
            % 200;
        let delay = AVOIDED_NAK + std::time::Duration::from_millis(u64::from(jitter));
        tracing::debug!(job = %task.job, shard = task.shard, check = task.check, delay_ms = delay.as_millis() as u64,
            "check run of this machine's own result handed back");
        if let Err(e) = msg.ack_with(AckKind::Nak(Some(delay))).await {
            tracing::warn!(error = %e, "nak not sent; the task returns after the ack wait");
        }
        return Handled {
            avoided: true,
            ..Handled::nothing()
        };
    }
    let reply = msg
        .reply
        .as_ref()
        .map(|r| r.to_string())
        .unwrap_or_default();
    let Stops { hand_back, cancel } = ctx.running.track(InFlight {
        job: task.job.clone(),
        shard: task.shard,
        reply: reply.clone(),
        started_ms: now_ms(),
    });
    // From here the delivery shares the machine's energy.
    let energy_key = crate::energy::DeliveryKey::new(task.job.as_str(), task.shard, attempt);
    ctx.energy.begin(energy_key.clone());
    tracing::debug!(job = %task.job, shard = task.shard, attempt, "shard started");
    publish_event(ctx, &task, attempt, EventKind::Started, false).await;

    let progress = CancellationToken::new();
    let keepalive = tokio::spawn(keep_alive(ctx.clone(), reply, progress.clone()));
    let started = Instant::now();
    let result = if task.family.generates() || task.family == ModelFamily::WhisperSpeech {
        // A generation or speech shard watches both tokens itself, to
        // checkpoint what it finished before it lets go.
        run(ctx, &task, attempt, &hand_back, &cancel, claim).await
    } else {
        tokio::select! {
            r = run(ctx, &task, attempt, &hand_back, &cancel, claim) => r,
            _ = hand_back.cancelled() => Err(ShardError::Stopping),
            _ = cancel.cancelled() => Err(ShardError::Cancelled),
        }
    };
    progress.cancel();
    let _ = keepalive.await;
    let duration_ms = started.elapsed().as_millis() as u64;
    // Its share up to the result; settling (event, ack) is not counted.
    let energy = ctx.energy.end(&energy_key);
    let busy_ms = result.as_ref().map_or(0, |d| d.compute_ms);
    if result.is_ok() {
        let ctx = ctx.clone();
        let settling = tokio::spawn(async move {
            let _ = settle(&ctx, &msg, &task, attempt, duration_ms, result, energy).await;
            ctx.running.untrack(task.job.as_str(), task.shard);
        });
        return Handled {
            busy_ms,
            settling: Some(settling),
            avoided: false,
            rest: None,
        };
    }
    let rest = settle(ctx, &msg, &task, attempt, duration_ms, result, energy).await;
    ctx.running.untrack(task.job.as_str(), task.shard);
    Handled {
        busy_ms,
        settling: None,
        rest,
        avoided: false,
    }
}

impl Handled {
    /// A delivery settled on the spot that kept the device idle.
    fn nothing() -> Self {
        Self {
            busy_ms: 0,
            settling: None,
            avoided: false,
            rest: None,
        }
    }
}

/// Sends in-progress acks every third of the ack wait until cancelled, so a
/// long shard is not redelivered while this worker is alive.
async fn keep_alive(ctx: Arc<Ctx>, reply: String, stop: CancellationToken) {
    if reply.is_empty() {
        return;
    }
    let every = (ctx.settings.ack_wait / 3).max(std::time::Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if let Err(e) = ctx
            .client
            .publish(reply.clone(), Bytes::from(AckKind::Progress))
            .await
        {
            tracing::warn!(error = %e, "in-progress ack not sent");
        }
    }
}

async fn run(
    ctx: &Ctx,
    task: &ShardTask,
    attempt: u64,
    hand_back: &CancellationToken,
    cancel: &CancellationToken,
    claim: Option<crate::shared_run::Claim>,
) -> Result<Done, ShardError> {
    if ctx.running.is_cancelled(task.job.as_str()) {
        return Err(ShardError::Cancelled);
    }
    let out_key = StorePath::from(task.output_key());
    // Only a redelivery is likely to find its output written already; a
    // first delivery skips the lookup (the create-only write still catches a
    // duplicate) so the common path pays no extra store round-trip.
    if attempt > 1 {
        match ctx.store.head(&out_key).await {
            Ok(_) => return verify_existing(ctx, task, &out_key).await,
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (model, input) = tokio::select! {
        r = async {
            let model = match ctx.groups.lead_model(&task.job) {
                Some(m) => m,
                None => {
                    ctx.cache
                        .get(&task.model_hash, task.family, task.precision)
                        .await?
                }
            };
            let input = read_input(ctx.store.as_ref(), task).await?;
            Ok::<_, ShardError>((model, input))
        } => r?,
        _ = hand_back.cancelled() => return Err(ShardError::Stopping),
        _ = cancel.cancelled() => return Err(ShardError::Cancelled),
    };
    let (mut payload, compute_ms, work) = match task.family {
        f if f.generates() => {
            let stops = Stops {
                hand_back: hand_back.clone(),
                cancel: cancel.clone(),
            };
            let g = crate::generation::run(ctx, task, attempt, model, input, &stops, claim).await?;
            (
                g.payload,
                g.compute_ms,
                Work {
                    tokens: g.tokens,
                    audio_ms: 0,
                },
            )
        }
        ModelFamily::WhisperSpeech => {
            let t = crate::speech::run(ctx, task, attempt, model, input, hand_back, cancel).await?;
            (
                t.payload,
                t.compute_ms,
                Work {
                    tokens: 0,
                    audio_ms: t.audio_ms,
                },
            )
        }
        _ => {
            let (payload, compute_ms) = embed(ctx, task, model, input, claim).await?;
            (payload, compute_ms, Work::default())
        }
    };
    if ctx
        .settings
        .perturb
        .is_some_and(|p| p.hits(task.job.as_str(), task.shard))
    {
        crate::fault::Perturb::apply(&mut payload);
    }
    write_output(ctx, task, &out_key, payload, compute_ms, work).await
}

/// What a shard's run did besides its rows.
#[derive(Clone, Copy, Debug, Default)]
struct Work {
    /// Tokens generated.
    tokens: u64,
    /// Milliseconds of audio transcribed.
    audio_ms: u64,
}

/// Runs an embedding shard's texts on the device, packed with the other
/// shards of the same model that wait for it ([`crate::pack`]). `claim`,
/// for a join slot's pull, is let go once the shard is queued.
async fn embed(
    ctx: &Ctx,
    task: &ShardTask,
    model: std::sync::Arc<dyn crate::model::Model>,
    input: ShardInput,
    claim: Option<crate::shared_run::Claim>,
) -> Result<(minions_schemas::messages::OutputPayload, u64), ShardError> {
    let batching = Batching {
        max_texts: if task.max_batch > 0 {
            task.max_batch as usize
        } else {
            ctx.settings.max_batch
        },
        max_tokens: ctx.settings.batch_tokens,
    };
    let texts = input.texts;
    // The test-only pace switch: the device stays held, as on a slower
    // machine (a hand-back of every shard of the pack ends the wait).
    let paced = ctx
        .settings
        .pace
        .as_ref()
        .and_then(|p| p.for_shard(task.model_hash.as_str(), texts.len()));
    let waiting = ctx.packs.queue(crate::pack::Request {
        model_hash: task.model_hash.clone(),
        model,
        batching,
        texts,
        paced,
    });
    if claim.is_some() {
        // Queued: the next extra pull may start, while the pack has room.
        drop(claim);
        ctx.packs.reconsider();
    }
    let packed = waiting.result().await?;
    Ok((packed.payload, packed.compute_ms))
}

/// Writes a computed output create-only ("already exists": an earlier
/// delivery finished it, verify that one instead).
async fn write_output(
    ctx: &Ctx,
    task: &ShardTask,
    out_key: &StorePath,
    payload: minions_schemas::messages::OutputPayload,
    compute_ms: u64,
    work: Work,
) -> Result<Done, ShardError> {
    let output = ShardOutput {
        v: SCHEMA_VERSION,
        job: task.job.clone(),
        shard: task.shard,
        first_row: task.first_row,
        rows: u64::from(task.rows),
        model_hash: task.model_hash.clone(),
        worker: ctx.identity.worker_id(),
        payload,
        made_by: Some(ctx.identity.made_by.clone()),
    };
    output.check_shape().map_err(ShardError::Permanent)?;
    let bytes =
        encode("shard output", &output).map_err(|e| ShardError::Permanent(e.to_string()))?;
    let output_bytes = bytes.len() as u64;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    let done = match ctx.store.put_opts(out_key, bytes.into(), opts).await {
        Ok(_) => Done {
            rows: output.rows,
            tokens: work.tokens,
            audio_ms: work.audio_ms,
            sha256,
            output_bytes,
            compute_ms,
            already_done: false,
            made_by: output.made_by.clone(),
        },
        Err(object_store::Error::AlreadyExists { .. }) => {
            tracing::info!(job = %task.job, shard = task.shard, "output written meanwhile by an earlier delivery");
            verify_existing(ctx, task, out_key).await?
        }
        Err(e) => return Err(e.into()),
    };
    if task.family.generates() || task.family == ModelFamily::WhisperSpeech {
        crate::generation::forget(ctx, task).await;
    }
    Ok(done)
}

async fn read_input(store: &dyn ObjectStore, task: &ShardTask) -> Result<ShardInput, ShardError> {
    let key = StorePath::from(keys::shard_input(&task.job, task.shard));
    let got = match store.get(&key).await {
        Ok(g) => g,
        // Transient: a store that replicates slowly, or inputs being
        // re-uploaded; after max deliveries the shard is dead-lettered.
        Err(object_store::Error::NotFound { .. }) => {
            return Err(ShardError::Transient(format!(
                "shard input {key} is missing from the store"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    if got.meta.size > limits::MAX_SHARD_INPUT_BYTES as u64 {
        return Err(ShardError::Permanent(format!(
            "shard input {key} is {} bytes; the limit is {}",
            got.meta.size,
            limits::MAX_SHARD_INPUT_BYTES
        )));
    }
    let bytes = got.bytes().await?;
    let input: ShardInput = decode("shard input", &bytes, limits::MAX_SHARD_INPUT_BYTES)
        .map_err(|e| ShardError::Permanent(format!("{key}: {e}")))?;
    if input.job != task.job || input.shard != task.shard || input.len() != task.rows as usize {
        return Err(ShardError::Permanent(format!(
            "shard input {key} holds job {} shard {} with {} records; the task expects job {} shard {} with {}",
            input.job,
            input.shard,
            input.len(),
            task.job,
            task.shard,
            task.rows
        )));
    }
    Ok(input)
}

async fn verify_existing(ctx: &Ctx, task: &ShardTask, key: &StorePath) -> Result<Done, ShardError> {
    let got = ctx.store.get(key).await?;
    if got.meta.size > limits::MAX_SHARD_OUTPUT_BYTES as u64 {
        return Err(ShardError::Permanent(format!(
            "existing output {key} is too large"
        )));
    }
    let bytes = got.bytes().await?;
    let out: ShardOutput = decode("shard output", &bytes, limits::MAX_SHARD_OUTPUT_BYTES)
        .map_err(|e| ShardError::Permanent(format!("existing output {key} is damaged: {e}")))?;
    out.check_belongs(&task.job, task.shard, u64::from(task.rows))
        .map_err(|why| {
            ShardError::Permanent(format!(
                "existing output {key} does not belong to this shard: {why}"
            ))
        })?;
    let (tokens, audio_ms) = match &out.payload {
        minions_schemas::messages::OutputPayload::Generations { records } => (
            records.iter().map(|g| u64::from(g.completion_tokens)).sum(),
            0,
        ),
        minions_schemas::messages::OutputPayload::Transcripts { records } => (
            0,
            records
                .iter()
                .map(minions_schemas::messages::Transcription::audio_ms)
                .sum(),
        ),
        minions_schemas::messages::OutputPayload::Embeddings { .. } => (0, 0),
    };
    Ok(Done {
        rows: out.rows,
        tokens,
        audio_ms,
        sha256: hex::encode(Sha256::digest(&bytes)),
        output_bytes: 0,
        compute_ms: 0,
        already_done: true,
        made_by: out.made_by,
    })
}

/// Settles a delivery and publishes the event that ends it, carrying the
/// delivery's `energy`.
async fn settle(
    ctx: &Ctx,
    msg: &Message,
    task: &ShardTask,
    attempt: u64,
    duration_ms: u64,
    result: Result<Done, ShardError>,
    energy: Option<Energy>,
) -> Option<std::time::Duration> {
    match result {
        Ok(done) => {
            let kind = if task.check > 0 {
                EventKind::Checked {
                    round: task.check,
                    rows: done.rows,
                    output_bytes: done.output_bytes,
                    duration_ms,
                    compute_ms: done.compute_ms,
                    sha256: done.sha256,
                    made_by: done.made_by,
                }
            } else {
                EventKind::Done {
                    rows: done.rows,
                    output_bytes: done.output_bytes,
                    duration_ms,
                    compute_ms: done.compute_ms,
                    already_done: done.already_done,
                    sha256: done.sha256,
                    tokens: done.tokens,
                    audio_ms: done.audio_ms,
                    made_by: done.made_by,
                }
            };
            if !done.already_done {
                ctx.running.record_duration(duration_ms);
            }
            // Ack only once the done event is stored: an acked shard whose
            // event was lost would leave its job short of done for ever. A
            // redelivery finds the output, verifies it and reports it again.
            if !publish(ctx, task, attempt, kind, true, energy).await {
                tracing::warn!(job = %task.job, shard = task.shard,
                    "done event not stored; handing the shard back so a redelivery reports it");
                if let Err(e) = msg.ack_with(AckKind::Nak(Some(backoff(attempt)))).await {
                    tracing::warn!(error = %e, "nak not sent; the shard returns after the ack wait");
                }
                return None;
            }
            match msg.double_ack().await {
                Ok(()) => tracing::info!(job = %task.job, shard = task.shard, attempt, duration_ms,
                    compute_ms = done.compute_ms, already_done = done.already_done, "shard done"),
                // The output is in the store: a redelivery finds it and acks.
                Err(e) => tracing::warn!(job = %task.job, shard = task.shard, error = %e,
                    "ack not confirmed; a redelivery will find the output and ack"),
            }
            ctx.running.count_done();
        }
        Err(err) => {
            ctx.running.count_failed();
            let reason = err.to_string();
            let mut settle = err.settle(attempt);
            let last = ctx.settings.max_deliver > 0 && attempt >= ctx.settings.max_deliver as u64;
            if matches!(settle, Settle::Nak(_)) && last {
                settle = Settle::Term;
            }
            match settle {
                Settle::Term => {
                    let reason =
                        if matches!(err, ShardError::Transient(_) | ShardError::WrongMachine(_)) {
                            format!("gave up after {attempt} deliveries: {reason}")
                        } else {
                            reason
                        };
                    let stored = publish(
                        ctx,
                        task,
                        attempt,
                        EventKind::Failed {
                            reason: reason.clone(),
                            permanent: true,
                            stream_seq: msg.info().ok().map(|i| i.stream_sequence),
                        },
                        true,
                        energy,
                    )
                    .await;
                    if stored {
                        tracing::error!(job = %task.job, shard = task.shard, attempt, reason = %reason, "shard failed for good; terminated");
                        term(ctx, msg, &reason).await;
                    } else {
                        // Terminating without a stored failure would hide it;
                        // a redelivery (or the max-deliveries advisory) reports it.
                        tracing::warn!(job = %task.job, shard = task.shard, "failure event not stored; handing the shard back");
                        let _ = msg.ack_with(AckKind::Nak(Some(backoff(attempt)))).await;
                    }
                }
                Settle::Nak(delay) => {
                    tracing::warn!(job = %task.job, shard = task.shard, attempt, reason = %reason,
                        retry_in_ms = delay.as_millis() as u64, "shard failed; will retry");
                    publish(
                        ctx,
                        task,
                        attempt,
                        EventKind::Failed {
                            reason,
                            permanent: false,
                            stream_seq: None,
                        },
                        true,
                        energy,
                    )
                    .await;
                    if let Err(e) = msg.ack_with(AckKind::Nak(Some(delay))).await {
                        tracing::warn!(error = %e, "nak not sent; the shard returns after the ack wait");
                    }
                    if matches!(err, ShardError::WrongMachine(_)) {
                        // Pulling again before the shard is back would queue
                        // this slot's pull ahead of a larger machine's and
                        // take the shard again. Rest until a second after it
                        // returns, so a waiting larger machine is served first.
                        return Some((delay + WRONG_MACHINE_REST).min(MAX_WRONG_MACHINE_REST));
                    }
                }
                Settle::HandBack => {
                    let why = ctx.hand_back_reason(task.job.as_str(), task.shard);
                    tracing::info!(job = %task.job, shard = task.shard, why = %why, "shard handed back");
                    if let Err(e) = msg.ack_with(AckKind::Nak(None)).await {
                        tracing::warn!(error = %e, "hand-back not sent; the shard returns after the ack wait");
                    }
                    // After the nak: the next worker must not wait on this.
                    publish(
                        ctx,
                        task,
                        attempt,
                        EventKind::HandedBack { reason: why },
                        false,
                        energy,
                    )
                    .await;
                }
            }
        }
    }
    None
}

/// Terminates a delivery with a reason (JetStream keeps it in its advisory).
async fn term(ctx: &Ctx, msg: &Message, reason: &str) {
    let Some(reply) = msg.reply.clone() else {
        return;
    };
    let short: String = reason.chars().take(512).collect();
    let body = Bytes::from(format!("+TERM {short}"));
    if let Err(e) = ctx.client.publish(reply, body).await {
        tracing::warn!(error = %e, "term not sent");
    }
}
