//! Continuous batching over one shard's records, and over the records of
//! further shards that join the run while it goes on ([`Feed`]).
//!
//! Up to [`GenLimits::max_seqs`] sequences are in flight, each with its own
//! cache sized for its prompt plus its `max_tokens`; a sequence is admitted
//! only while the caches in flight fit the KV budget, and when one ends the
//! next record takes its place. Every pass carries one new token for each
//! generating sequence and prompt chunks for sequences still reading theirs.
//! A prompt is always read in the same chunks ([`GenLimits::prefill_chunk`]),
//! whatever else shares the pass, so a record's tokens never depend on its
//! batch.
//!
//! With our CPU kernels, a prefix that most of the records' prompts share (a
//! system prompt, a few-shot preamble) is read once, and its keys and
//! values are copied into each of those records' caches
//! ([`shared_prefix`]). It always ends at least two tokens short of the
//! record's first chunk, so that chunk's rest is still read in a step of
//! several tokens: the same sums in the same order, the same bits as
//! reading the chunk whole. candle's ops (GPUs, and the CPU's device path)
//! sum rows in an order that depends on their length, so there every
//! prompt is read whole ([`Llama::reads_in_parts_exactly`]).

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
#[derive(Clone)]
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

/// What one sequence does in a pass.
#[derive(Clone)]
pub(super) enum Plan {
    /// Reads its last generated token.
    Decode,
    /// Reads this chunk of its prompt.
    Prefill(std::ops::Range<usize>),
}

/// Plans one pass over sequences, each given as (prompt tokens read,
/// prompt length): generated tokens first, then prompt chunks while the
/// pass has room for `pass_tokens`; a pass always takes at least one
/// step. Chunks end at multiples of `chunk`, so a shared prefix shortens
/// only the first, and a prompt is read in the same chunks whatever else
/// shares its passes.
pub(super) fn plan_pass(
    reads: impl Iterator<Item = (usize, usize)> + Clone,
    pass_tokens: usize,
    chunk: usize,
) -> Vec<Option<Plan>> {
    let mut room = pass_tokens.max(1);
    let mut plan: Vec<Option<Plan>> = Vec::new();
    for (read, len) in reads.clone() {
        if read == len {
            plan.push(Some(Plan::Decode));
            room = room.saturating_sub(1);
        } else {
            plan.push(None);
        }
    }
    let mut planned_any = plan.iter().any(Option::is_some);
    for ((read, len), p) in reads.zip(plan.iter_mut()) {
        if p.is_some() {
            continue;
        }
        let n = (chunk - read % chunk).min(len - read);
        if n <= room || !planned_any {
            *p = Some(Plan::Prefill(read..read + n));
            room = room.saturating_sub(n);
            planned_any = true;
        }
    }
    plan
}

/// Records that join a run while it goes on, and records that leave it
/// unfinished. A run takes new records between passes, so they share the
/// passes of the records already running; a record's tokens never depend
/// on what shares its passes, so a record that joined equals the same
/// record run alone.
pub trait Feed {
    /// Records ready to join now (their indices unique within the run), or
    /// the reason one cannot run.
    fn take(&mut self) -> Vec<Result<Prepared, (usize, String)>>;
    /// Whether a record may have stopped being wanted since the last call
    /// (cheap: asked before every pass); only then is [`Feed::wanted`] asked
    /// of each record.
    fn departed(&mut self) -> bool;
    /// Whether record `index` still wants its result; `false` drops it from
    /// the run, unfinished, and frees its cache.
    fn wanted(&self, index: usize) -> bool;
    /// Called when nothing is left to run: returns the records that join
    /// now, or none, which ends the run (a feed that ends a run takes no
    /// records after it).
    fn wait(&mut self) -> Vec<Result<Prepared, (usize, String)>>;
    /// Called before each pass: sequences running and records waiting for
    /// room.
    fn settled(&mut self, running: usize, waiting: usize);
}

/// The feed of a run over one fixed set of records: nothing joins.
pub struct NoFeed;

impl Feed for NoFeed {
    fn take(&mut self) -> Vec<Result<Prepared, (usize, String)>> {
        Vec::new()
    }
    fn departed(&mut self) -> bool {
        false
    }
    fn wanted(&self, _: usize) -> bool {
        true
    }
    fn wait(&mut self) -> Vec<Result<Prepared, (usize, String)>> {
        Vec::new()
    }
    fn settled(&mut self, _: usize, _: usize) {}
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
    generate_fed(model, tokenizer, work, limits, control, &mut NoFeed, done)
}

/// [`generate`], taking in the records `feed` brings while it runs and
/// dropping those it no longer wants; ends when nothing runs and the feed
/// brings nothing more.
pub fn generate_fed(
    model: &Llama,
    tokenizer: &GgufTokenizer,
    work: Vec<Prepared>,
    limits: GenLimits,
    control: &GenControl,
    feed: &mut dyn Feed,
    done: &mut dyn FnMut(usize, Generation),
) -> Result<(), ModelError> {
    let per_token = model.config().kv_bytes_per_token();
    let chunk = limits.prefill_chunk.max(1);
    let mut used = 0usize;
    // Off our CPU kernels a prefix read apart changes the bits of what
    // follows, so each prompt is read whole there.
    let shared = if model.reads_in_parts_exactly() {
        shared_prefix(&work, chunk)
    } else {
        0
    };
    let prefix = match work.first() {
        Some(first) if shared > 0 => {
            let tokens = first.prompt[..shared].to_vec();
            let mut cache = model.new_cache(shared)?;
            model.forward(
                &mut [Step {
                    cache: &mut cache,
                    tokens: &tokens,
                }],
                false,
            )?;
            used += shared * per_token;
            Some((tokens, cache))
        }
        _ => None,
    };
    let mut pending: VecDeque<Prepared> = work.into();
    let mut active: Vec<Active> = Vec::new();
    let arrive = |pending: &mut VecDeque<Prepared>,
                  got: Vec<Result<Prepared, (usize, String)>>,
                  done: &mut dyn FnMut(usize, Generation)| {
        for g in got {
            match g {
                Ok(p) => pending.push_back(p),
                Err((index, why)) => done(index, Generation::failed(why)),
            }
        }
    };
    loop {
        if control.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Records whose shard left go; those joining queue behind the rest.
        if feed.departed() {
            active.retain(|a| {
                let keep = feed.wanted(a.index);
                if !keep {
                    used -= a.bytes;
                }
                keep
            });
            pending.retain(|p| feed.wanted(p.index));
        }
        arrive(&mut pending, feed.take(), done);
        while active.len() < limits.max_seqs.max(1) {
            let Some(next) = pending.front() else { break };
            let tokens = next.prompt.len() + next.params.max_tokens as usize;
            let bytes = tokens * per_token;
            if !active.is_empty() && used + bytes > limits.kv_budget_bytes {
                break;
            }
            let Some(p) = pending.pop_front() else { break };
            let mut cache = match model.new_cache(tokens) {
                Ok(c) => c,
                Err(ModelError::BadInput(m)) => {
                    done(p.index, Generation::failed(m));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut read = 0;
            if let Some((tokens, from)) = &prefix
                && p.prompt.starts_with(tokens)
                && tokens.len() <= shareable(p.prompt.len(), chunk)
            {
                model.copy_prefix(&mut cache, from, tokens.len())?;
                read = tokens.len();
                control
                    .prompt_read
                    .fetch_add(read as u64, Ordering::Relaxed);
            }
            used += bytes;
            active.push(Active {
                index: p.index,
                sampler: Sampler::new(&p.params),
                prompt: p.prompt,
                read,
                cache,
                out: Vec::new(),
                params: p.params,
                bytes,
            });
        }
        feed.settled(active.len(), pending.len());
        if active.is_empty() {
            // Nothing runs, so nothing waits (one record is always let in).
            let more = feed.wait();
            if more.is_empty() {
                return Ok(());
            }
            arrive(&mut pending, more, done);
            continue;
        }
        let plan = plan_pass(
            active.iter().map(|a| (a.read, a.prompt.len())),
            limits.pass_tokens,
            chunk,
        );
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
            let ended = advance(&mut a.out, a.prompt.len(), &a.params, next, tokenizer);
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

/// The shortest prefix worth reading once for several records.
const MIN_SHARED: usize = 4;

/// How many leading tokens of a prompt of `len` tokens may come from a
/// shared prefix: all but two of its first chunk, so the rest of that chunk
/// is still read in a step of several tokens.
pub(super) fn shareable(len: usize, chunk: usize) -> usize {
    len.min(chunk).saturating_sub(2)
}

/// How many leading tokens of the first record's prompt to read once and
/// share: the length that saves the most reading, that is the length times
/// the records whose prompts start with it (and may share it), less the
/// one read of it; 0 when that length is under [`MIN_SHARED`] tokens or
/// sharing saves nothing.
pub(super) fn shared_prefix(work: &[Prepared], chunk: usize) -> usize {
    let Some(first) = work.first() else { return 0 };
    let mut usable: Vec<usize> = work
        .iter()
        .map(|w| {
            let common = first
                .prompt
                .iter()
                .zip(&w.prompt)
                .take_while(|(a, b)| a == b)
                .count();
            common.min(shareable(w.prompt.len(), chunk))
        })
        .collect();
    usable.sort_unstable_by(|a, b| b.cmp(a));
    // The i+1 longest can all take a prefix of usable[i]: i reads saved.
    let (mut best, mut saved) = (0, 0);
    for (i, &len) in usable.iter().enumerate() {
        if len * i > saved {
            (best, saved) = (len, len * i);
        }
    }
    if best >= MIN_SHARED { best } else { 0 }
}

/// Takes the sampled token `next` into a record's output `out`; returns the
/// record's result when it has ended.
pub(super) fn advance(
    out: &mut Vec<u32>,
    prompt_len: usize,
    params: &SamplingParams,
    next: u32,
    tokenizer: &GgufTokenizer,
) -> Option<Generation> {
    let prompt_tokens = prompt_len as u32;
    let finish = |out: &[u32], text: String, reason: FinishReason| Generation {
        text,
        finish_reason: reason,
        prompt_tokens,
        completion_tokens: out.len() as u32,
        error: None,
    };
    if tokenizer.is_end_of_generation(next) {
        let text = tokenizer.decode(out);
        return Some(finish(out, text, FinishReason::Stop));
    }
    out.push(next);
    if !params.stop.is_empty() {
        let text = tokenizer.decode(out);
        if let Some(cut) = params
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min()
        {
            let mut text = text;
            text.truncate(cut);
            return Some(finish(out, text, FinishReason::Stop));
        }
    }
    if out.len() >= params.max_tokens as usize {
        let text = tokenizer.decode(out);
        return Some(finish(out, text, FinishReason::Length));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(prompt: &[u32]) -> Prepared {
        Prepared {
            index: 0,
            prompt: prompt.to_vec(),
            params: SamplingParams {
                max_tokens: 1,
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                seed: 0,
                stop: vec![],
            },
        }
    }

    #[test]
    fn the_prefix_shared_is_the_one_that_saves_the_most_reading() {
        let sys: Vec<u32> = (1..=10).collect();
        let with = |tail: &[u32]| record(&[&sys[..], tail].concat());
        // Three records share 10 tokens; each keeps two of its own.
        let work = [with(&[50, 51]), with(&[60, 61, 62]), with(&[70, 71])];
        assert_eq!(shared_prefix(&work, 256), 10);
        // A record without the prefix does not stop the others sharing it.
        let odd = [
            with(&[50, 51]),
            record(&[9, 9, 9, 9, 9, 9]),
            with(&[70, 71]),
        ];
        assert_eq!(shared_prefix(&odd, 256), 10);
        // A record of one token after it would read that token in a step
        // of one: it may take only 9, and all three sharing 9 save more
        // than two sharing 10.
        let short = [with(&[50, 51]), with(&[60]), with(&[70, 71])];
        assert_eq!(shared_prefix(&short, 256), 9);
        // Four sharing 10 save more than five sharing 5.
        let five = [
            with(&[1, 1]),
            with(&[2, 2]),
            with(&[3, 3]),
            with(&[4, 4]),
            record(&sys[..7]),
        ];
        assert_eq!(shared_prefix(&five, 256), 10);
        // The first chunk keeps two tokens of its own.
        assert_eq!(shared_prefix(&work, 8), 6);
        // Nothing to share: one record, or prefixes under the minimum.
        assert_eq!(shared_prefix(&work[..1], 256), 0);
        let tiny = [record(&[1, 2, 3, 4, 5]), record(&[1, 2, 3, 9, 9])];
        assert_eq!(shared_prefix(&tiny, 256), 0);
        assert_eq!(shared_prefix(&[], 256), 0);
    }
}
