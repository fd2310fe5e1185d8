//! Continuous batching over one shard's records.
//!
//! Up to [`GenLimits::max_seqs`] sequences are in flight, each with its own
//! cache sized for its prompt plus its `max_tokens`; a sequence is admitted
//! only while the caches in flight fit the KV budget, and when one ends the
//! next record takes its place. Every pass carries one new token for each
//! generating sequence and prompt chunks for sequences still reading theirs.
//! A prompt is always read in the same chunks ([`GenLimits::prefill_chunk`]),
//! whatever else shares the pass, so a record's tokens never depend on its
//! batch.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use minions_schemas::messages::{FinishReason, Generation, SamplingParams};

use super::llama::{KvCache, Llama, Step};
use super::sampler::Sampler;
use super::tokenizer::GgufTokenizer;
use crate::ModelError;

/// How much one generation run may hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenLimits {
    /// Sequences in flight at once, at least 1.
    pub max_seqs: usize,
    /// Tokens per forward pass (prompt chunks and generated tokens); a pass
    /// always takes at least one sequence's step.
    pub pass_tokens: usize,
    /// A prompt is read in chunks of this many tokens.
    pub prefill_chunk: usize,
    /// Bytes the caches in flight may take; a single sequence always runs.
    pub kv_budget_bytes: usize,
}

impl Default for GenLimits {
    fn default() -> Self {
        Self {
            max_seqs: 32,
            pass_tokens: 512,
            prefill_chunk: 256,
            kv_budget_bytes: 1 << 30,
        }
    }
}

/// Live counters a caller may read while a run goes on, and its stop flag.
#[derive(Debug, Default)]
pub struct GenControl {
    /// Set to stop after the current pass; unfinished records are dropped
    /// (the caller runs them again later).
    pub stop: AtomicBool,
    /// Tokens generated so far.
    pub generated: AtomicU64,
    /// Prompt tokens read so far.
    pub prompt_read: AtomicU64,
}

/// One record ready to run: its index in the shard, its prompt tokens.
pub struct Prepared {
    /// The record's index within the shard.
    pub index: usize,
    /// The prompt, tokenized.
    pub prompt: Vec<u32>,
    /// How to sample it.
    pub params: SamplingParams,
}

struct Active {
    index: usize,
    prompt: Vec<u32>,
    read: usize,
    cache: KvCache,
    sampler: Sampler,
    out: Vec<u32>,
    params: SamplingParams,
    bytes: usize,
}

enum Plan {
    Decode,
    Prefill(std::ops::Range<usize>),
}

/// Runs `work` to the end (or until `control.stop`), handing each finished
/// record to `done` as soon as it ends.
pub fn generate(
    model: &Llama,
    tokenizer: &GgufTokenizer,
    work: Vec<Prepared>,
    limits: GenLimits,
    control: &GenControl,
    done: &mut dyn FnMut(usize, Generation),
) -> Result<(), ModelError> {
    let per_token = model.config().kv_bytes_per_token();
    let mut pending: VecDeque<Prepared> = work.into();
    let mut active: Vec<Active> = Vec::new();
    let mut used = 0usize;
    let chunk = limits.prefill_chunk.max(1);
    loop {
        if control.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        while active.len() < limits.max_seqs.max(1) {
            let Some(next) = pending.front() else { break };
            let tokens = next.prompt.len() + next.params.max_tokens as usize;
            let bytes = tokens * per_token;
            if !active.is_empty() && used + bytes > limits.kv_budget_bytes {
                break;
            }
            let Some(p) = pending.pop_front() else { break };
            let cache = match model.new_cache(tokens) {
                Ok(c) => c,
                Err(ModelError::BadInput(m)) => {
                    done(p.index, Generation::failed(m));
                    continue;
                }
                Err(e) => return Err(e),
            };
            used += bytes;
            active.push(Active {
                index: p.index,
                sampler: Sampler::new(&p.params),
                prompt: p.prompt,
                read: 0,
                cache,
                out: Vec::new(),
                params: p.params,
                bytes,
            });
        }
        if active.is_empty() {
            return Ok(());
        }
        // Generated tokens first, then prompt chunks while the pass has room.
        let mut room = limits.pass_tokens.max(1);
        let mut plan: Vec<Option<Plan>> = Vec::with_capacity(active.len());
        for a in &active {
            if a.read == a.prompt.len() {
                plan.push(Some(Plan::Decode));
                room = room.saturating_sub(1);
            } else {
                plan.push(None);
            }
        }
        let mut planned_any = plan.iter().any(Option::is_some);
        for (a, p) in active.iter().zip(plan.iter_mut()) {
            if p.is_some() {
                continue;
            }
            let n = chunk.min(a.prompt.len() - a.read);
            if n <= room || !planned_any {
                *p = Some(Plan::Prefill(a.read..a.read + n));
                room = room.saturating_sub(n);
                planned_any = true;
            }
        }
        let mut steps = Vec::new();
        let mut stepped = Vec::new();
        for (i, (a, p)) in active.iter_mut().zip(&plan).enumerate() {
            let Some(p) = p else { continue };
            let Active {
                cache, prompt, out, ..
            } = a;
            let tokens: &[u32] = match p {
                Plan::Decode => &out[out.len() - 1..],
                Plan::Prefill(r) => &prompt[r.clone()],
            };
            steps.push(Step { cache, tokens });
            stepped.push(i);
        }
        let logits = model.forward(&mut steps, false)?;
        drop(steps);
        let mut finished = Vec::new();
        for (row, &i) in stepped.iter().enumerate() {
            let a = &mut active[i];
            match &plan[i] {
                Some(Plan::Prefill(r)) => {
                    a.read = r.end;
                    control
                        .prompt_read
                        .fetch_add(r.len() as u64, Ordering::Relaxed);
                    if a.read < a.prompt.len() {
                        continue;
                    }
                }
                Some(Plan::Decode) | None => {}
            }
            let next = a.sampler.next(&Llama::row(&logits, row)?)?;
            let before = a.out.len();
            let ended = advance(a, next, tokenizer);
            control
                .generated
                .fetch_add((a.out.len() - before) as u64, Ordering::Relaxed);
            if let Some(g) = ended {
                finished.push((i, g));
            }
        }
        for (i, g) in finished.into_iter().rev() {
            let a = active.remove(i);
            used -= a.bytes;
            done(a.index, g);
        }
    }
}

/// Takes the sampled token `next`; returns the record's result when it has
/// ended.
fn advance(a: &mut Active, next: u32, tokenizer: &GgufTokenizer) -> Option<Generation> {
    let prompt_tokens = a.prompt.len() as u32;
    let finish = |out: &[u32], text: String, reason: FinishReason| Generation {
        text,
        finish_reason: reason,
        prompt_tokens,
        completion_tokens: out.len() as u32,
        error: None,
    };
    if tokenizer.is_end_of_generation(next) {
        let text = tokenizer.decode(&a.out);
        return Some(finish(&a.out, text, FinishReason::Stop));
    }
    a.out.push(next);
    if !a.params.stop.is_empty() {
        let text = tokenizer.decode(&a.out);
        if let Some(cut) = a
            .params
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min()
        {
            let mut text = text;
            text.truncate(cut);
            return Some(finish(&a.out, text, FinishReason::Stop));
        }
    }
    if a.out.len() >= a.params.max_tokens as usize {
        let text = tokenizer.decode(&a.out);
        return Some(finish(&a.out, text, FinishReason::Length));
    }
    None
}
