//! Running a speech shard: each audio file fetched from the store and
//! decoded (a file that cannot be read fails alone, with its reason), then
//! transcribed window by window on the device, several files batched.
//! Finished files, and long files' finished windows, are checkpointed to
//! the store as they come, so a redelivery (after a crash, an eviction or
//! the owner's return) resumes where this delivery stopped: a window's text
//! depends on its audio alone, so resumed and whole runs agree.
//!
//! Files are taken in groups whose decoded audio stays under
//! [`AUDIO_BUDGET_SAMPLES`] (one file at least), so a shard of long files
//! holds one group's samples at a time, not the shard's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use minions_schemas::SCHEMA_VERSION;
use minions_schemas::messages::{
    AudioRecord, EventKind, OutputPayload, PartialTranscription, ShardCheckpoint, ShardInput,
    ShardTask, Transcription,
};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::error::ShardError;
use crate::model::Model;
use crate::model::speech::audio::{self, AudioLimits};
use crate::model::speech::{SHARD_BATCH, SpeechEvent, SpeechFile};

/// Decoded samples a group of files may hold together: one hour at 16 kHz
/// (230 MB of f32). A longer file runs alone.
pub(crate) const AUDIO_BUDGET_SAMPLES: usize = 3600 * 16_000;

/// What a speech run produced.
pub(crate) struct Transcribed {
    pub(crate) payload: OutputPayload,
    pub(crate) compute_ms: u64,
    /// Milliseconds of audio in the shard's files (checkpointed ones
    /// included).
    pub(crate) audio_ms: u64,
}

/// A shard's results so far.
struct State {
    done: Vec<Option<Transcription>>,
    partial: Vec<Option<PartialTranscription>>,
    unsaved: bool,
}

impl State {
    fn audio_ms(&self) -> u64 {
        self.done
            .iter()
            .flatten()
            .map(Transcription::audio_ms)
            .sum::<u64>()
            + self
                .partial
                .iter()
                .flatten()
                .map(|p| p.seek * 10)
                .sum::<u64>()
    }

    fn finished(&self) -> usize {
        self.done.iter().filter(|t| t.is_some()).count()
    }
}

/// Runs `input`'s audio files on `model`, resuming from the shard's
/// checkpoint. Returns `Stopping` or `Cancelled` when `hand_back` or
/// `cancel` fires, after checkpointing what is finished.
pub(crate) async fn run(
    ctx: &Ctx,
    task: &ShardTask,
    attempt: u64,
    model: Arc<dyn Model>,
    input: ShardInput,
    hand_back: &CancellationToken,
    cancel: &CancellationToken,
) -> Result<Transcribed, ShardError> {
    let n = input.audio.len();
    let mut state = State {
        done: vec![None; n],
        partial: vec![None; n],
        unsaved: false,
    };
    if let Some(cp) = crate::generation::read_checkpoint(ctx, task).await {
        let (mut files, mut windows) = (0, 0);
        for (i, t) in cp.transcripts {
            if let Some(slot) = state.done.get_mut(i as usize) {
                *slot = Some(t);
                files += 1;
            }
        }
        for (i, p) in cp.partial {
            if let Some(slot) = state.partial.get_mut(i as usize) {
                windows += p.windows;
                *slot = Some(p);
            }
        }
        tracing::info!(job = %task.job, shard = task.shard, attempt, files, windows, of = n,
            "resuming from checkpoint");
    }
    let permit = tokio::select! {
        p = ctx.runs.waiting_for_device(ctx.compute.acquire()) => p.map_err(|_| ShardError::Stopping)?,
        _ = hand_back.cancelled() => return Err(ShardError::Stopping),
        _ = cancel.cancelled() => return Err(ShardError::Cancelled),
    };
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut why_stopped: Option<ShardError> = None;
    let mut tick = tokio::time::interval(ctx.settings.generation.checkpoint_every);
    tick.tick().await;
    let mut todo: Vec<usize> = (0..n).filter(|&i| state.done[i].is_none()).collect();
    while !todo.is_empty() && why_stopped.is_none() {
        // Decode files until the group's audio fills the budget.
        let mut group: Vec<(usize, Vec<f32>)> = Vec::new();
        let mut held = 0usize;
        while let Some(&i) = todo.first() {
            if group.len() >= SHARD_BATCH || (held >= AUDIO_BUDGET_SAMPLES && !group.is_empty()) {
                break;
            }
            todo.remove(0);
            let decoded = tokio::select! {
                d = fetch_and_decode(ctx, &input.audio[i]) => d?,
                _ = hand_back.cancelled() => { why_stopped = Some(ShardError::Stopping); break }
                _ = cancel.cancelled() => { why_stopped = Some(ShardError::Cancelled); break }
            };
            match decoded {
                Ok(samples) => {
                    held += samples.len();
                    group.push((i, samples));
                }
                Err(why) => {
                    tracing::warn!(job = %task.job, shard = task.shard, record = i,
                        file = %input.audio[i].name, reason = %why, "audio file not transcribed");
                    state.done[i] = Some(Transcription::failed(why));
                    state.unsaved = true;
                }
            }
        }
        if why_stopped.is_some() || group.is_empty() {
            continue;
        }
        why_stopped = transcribe_group(
            ctx, task, attempt, &model, &input, group, &mut state, &stop, &mut tick, hand_back,
            cancel,
        )
        .await?;
    }
    drop(permit);
    let compute_ms = started.elapsed().as_millis() as u64;
    if let Some(stop) = why_stopped {
        if state.unsaved && matches!(stop, ShardError::Stopping) {
            save(ctx, task, &state).await;
        }
        return Err(stop);
    }
    let audio_ms = state.audio_ms();
    let records: Vec<Transcription> = state
        .done
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.ok_or_else(|| ShardError::Transient(format!("file {i} of the shard got no result")))
        })
        .collect::<Result<_, _>>()?;
    let failed = records.iter().filter(|t| t.error.is_some()).count();
    tracing::info!(job = %task.job, shard = task.shard, files = n, failed, audio_ms, compute_ms,
        "speech shard finished");
    Ok(Transcribed {
        payload: OutputPayload::Transcripts { records },
        compute_ms,
        audio_ms,
    })
}

/// Transcribes one group of decoded files on a blocking thread, keeping
/// their windows and results in `state` and checkpointing on `tick`.
/// Returns why it stopped early, if it did.
#[allow(clippy::too_many_arguments)]
async fn transcribe_group(
    ctx: &Ctx,
    task: &ShardTask,
    attempt: u64,
    model: &Arc<dyn Model>,
    input: &ShardInput,
    group: Vec<(usize, Vec<f32>)>,
    state: &mut State,
    stop: &Arc<AtomicBool>,
    tick: &mut tokio::time::Interval,
    hand_back: &CancellationToken,
    cancel: &CancellationToken,
) -> Result<Option<ShardError>, ShardError> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, SpeechEvent)>();
    let index: Vec<usize> = group.iter().map(|(i, _)| *i).collect();
    let options: Vec<_> = index
        .iter()
        .map(|&i| input.audio[i].options.clone())
        .collect();
    let resume: Vec<_> = index.iter().map(|&i| state.partial[i].clone()).collect();
    let (model, worker_stop) = (model.clone(), stop.clone());
    let blocking = tokio::task::spawn_blocking(move || {
        let files: Vec<SpeechFile<'_>> = group
            .iter()
            .zip(&options)
            .zip(resume)
            .map(|(((_, samples), options), resume)| SpeechFile {
                samples,
                options,
                resume,
            })
            .collect();
        model.transcribe(&files, &worker_stop, &mut |k, e| {
            let _ = tx.send((k, e));
        })
    });
    let mut why: Option<ShardError> = None;
    loop {
        tokio::select! {
            got = rx.recv() => match got {
                Some((k, e)) => {
                    let Some(&i) = index.get(k) else { continue };
                    match e {
                        SpeechEvent::Window(p) => state.partial[i] = Some(p),
                        SpeechEvent::Done(t) => {
                            tracing::debug!(job = %task.job, shard = task.shard, record = i, "file transcribed");
                            state.partial[i] = None;
                            state.done[i] = Some(t);
                        }
                    }
                    state.unsaved = true;
                }
                None => break,
            },
            _ = tick.tick() => {
                if state.unsaved {
                    save(ctx, task, state).await;
                }
                progress(ctx, task, attempt, state).await;
            }
            _ = hand_back.cancelled(), if why.is_none() => {
                stop.store(true, Ordering::Relaxed);
                why = Some(ShardError::Stopping);
            }
            _ = cancel.cancelled(), if why.is_none() => {
                stop.store(true, Ordering::Relaxed);
                why = Some(ShardError::Cancelled);
            }
        }
    }
    let outcome = blocking
        .await
        .map_err(|e| ShardError::Transient(format!("transcription task failed: {e}")))?;
    if let Err(e) = outcome {
        // What finished is kept for the next delivery.
        if state.unsaved {
            save(ctx, task, state).await;
        }
        return Err(e.into());
    }
    Ok(why)
}

/// Fetches one audio file from the store and decodes it to 16 kHz mono on
/// a blocking thread. The outer error is the store's (the shard is retried);
/// the inner one is the file's own (it fails alone).
async fn fetch_and_decode(
    ctx: &Ctx,
    rec: &AudioRecord,
) -> Result<Result<Vec<f32>, String>, ShardError> {
    let limits = AudioLimits::default();
    let key = match StorePath::parse(&rec.key) {
        Ok(k) => k,
        Err(e) => return Ok(Err(format!("{}: not a store key: {e}", rec.key))),
    };
    let got = match ctx.store.get(&key).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => {
            return Ok(Err(format!("{} is not in the store", rec.key)));
        }
        // A key named in a list that this worker's store policy may not
        // read: no retry would read it, so the file fails alone.
        Err(
            e @ (object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }),
        ) => {
            return Ok(Err(format!(
                "{}: the store refused to read it: {e}",
                rec.key
            )));
        }
        Err(e) => return Err(e.into()),
    };
    if got.meta.size > limits.max_bytes as u64 {
        return Ok(Err(format!(
            "{} is {} bytes; the limit is {}",
            rec.name, got.meta.size, limits.max_bytes
        )));
    }
    let bytes = got.bytes().await?;
    let hint = std::path::Path::new(&rec.name)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let name = rec.name.clone();
    let decoded = tokio::task::spawn_blocking(move || {
        // A decoder bug on a hostile file must fail that file, not the
        // worker.
        std::panic::catch_unwind(|| audio::decode(&bytes, hint.as_deref(), &limits))
    })
    .await
    .map_err(|e| ShardError::Transient(format!("audio decode task failed: {e}")))?;
    Ok(match decoded {
        Ok(Ok(a)) => Ok(a.samples),
        Ok(Err(e)) => Err(format!("{name}: {e}")),
        Err(_) => Err(format!("{name}: the audio decoder failed on this file")),
    })
}

/// Writes the finished files and long files' finished windows as the
/// shard's checkpoint (best effort: a failed write only means more work on
/// a redelivery).
async fn save(ctx: &Ctx, task: &ShardTask, state: &State) {
    let cp = ShardCheckpoint {
        v: SCHEMA_VERSION,
        job: task.job.clone(),
        shard: task.shard,
        rows: u64::from(task.rows),
        model_hash: task.model_hash.clone(),
        done: Vec::new(),
        transcripts: state
            .done
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.clone().map(|t| (i as u32, t)))
            .collect(),
        partial: state
            .partial
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.clone().map(|p| (i as u32, p)))
            .collect(),
    };
    crate::generation::write_checkpoint(ctx, task, &cp).await;
}

/// Publishes the shard's progress (files finished, audio done).
async fn progress(ctx: &Ctx, task: &ShardTask, attempt: u64, state: &State) {
    let kind = EventKind::Progress {
        records: state.finished() as u64,
        tokens: 0,
        audio_ms: state.audio_ms(),
    };
    crate::events::publish_event(ctx, task, attempt, kind, false).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audio_done_counts_finished_files_and_windows() {
        let mut t = Transcription::failed("x");
        t.duration = 12.5;
        let state = State {
            done: vec![Some(t), None],
            partial: vec![
                None,
                Some(PartialTranscription {
                    seek: 3000,
                    language: None,
                    windows: 1,
                    segments: Vec::new(),
                }),
            ],
            unsaved: false,
        };
        assert_eq!(state.audio_ms(), 12_500 + 30_000);
        assert_eq!(state.finished(), 1);
    }
}
