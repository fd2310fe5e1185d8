//! Continuous batching driven by the first stage of a split model.
//!
//! The first stage holds the embeddings and the first layers, and does
//! everything [`super::generate`] does for a whole model: it admits
//! records under the KV budget, plans each pass (generated tokens first,
//! prompt chunks while the pass has room, chunks always the same) and
//! decides when a record ends. The running sequences are split into
//! micro-batch groups; each group has at most one pass in flight, so while
//! one group's pass is on a later stage the first stage reads the next
//! group's. The last stage samples and answers with one token per step
//! that asks for one ([`super::stage`]).
//!
//! A record's tokens do not depend on its batch (as for a whole model), so
//! they equal the single worker's bit for bit. A prefix most prompts share
//! is read once, as on one worker: a pass of its own goes through every
//! stage first, and each stage copies its keys and values into the caches
//! of the sequences that open on it ([`StageOpen::prefix_of`]). A stage
//! whose kernels cannot read a prompt in parts exactly refuses that pass;
//! the group then reads whole prompts until it is re-formed.
//!
//! When a stage is lost, refuses a pass or answers out of turn, the run
//! ends with [`ModelError::StageLost`]; the records handed to `done` are
//! finished, the others run again from their prompts in a new epoch
//! ([`Split::restart`]), drawing the same tokens from their seeds.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use minions_schemas::SCHEMA_VERSION;
use minions_schemas::messages::{
    Generation, SamplingParams, StageOpen, StagePass, StageReply, StageStep,
};

use super::generate::{
    GenControl, GenLimits, Plan, Prepared, advance, plan_pass, shareable, shared_prefix,
};
use super::llama::{KvCache, Llama, StageOut, Step};
use super::tokenizer::GgufTokenizer;
use crate::ModelError;

/// How the first stage reaches the others: it sends a pass to the second
/// stage and receives the last stage's replies, in the order the passes
/// went out (each stage runs passes in the order they come).
pub trait StageLink {
    /// Sends a pass to the second stage.
    fn send(&mut self, pass: StagePass) -> Result<(), ModelError>;
    /// Waits for the last stage's next reply; an error (a stage lost, no
    /// answer in time) ends the epoch. It may give up early once `stop`
    /// is set.
    fn recv(&mut self, stop: &AtomicBool) -> Result<StageReply, ModelError>;
}

/// A group as its first stage drives it. Pass numbers and sequence ids
/// keep increasing across runs within an epoch.
#[derive(Debug, Clone)]
pub struct Split {
    /// The group's name, in every pass.
    pub group: String,
    /// The epoch its passes carry.
    pub epoch: u64,
    /// Micro-batch groups in flight at once (at least the number of
    /// stages keeps every stage busy).
    pub micro_groups: usize,
    /// The most layers any stage holds: the KV budget counts a token at
    /// that stage's size.
    pub widest_stage: usize,
    next_pass: u64,
    next_seq: u64,
    /// A run left passes in flight: the next one begins a new epoch.
    unsettled: bool,
    /// Records that were running (admitted, not finished) when the last
    /// run ended: after a lost stage, those run again from their prompts.
    pub in_flight: usize,
    /// How fast the first stage runs its own layers.
    pub pace: std::sync::Arc<super::pace::Pace>,
    /// A stage refused the pass that reads a shared prefix: prompts are
    /// read whole until the group is re-formed ([`Split::begin`]).
    prefix_refused: bool,
}

impl Split {
    /// A group in `epoch`.
    pub fn new(group: &str, epoch: u64, micro_groups: usize, widest_stage: usize) -> Self {
        Self {
            group: group.to_owned(),
            epoch,
            micro_groups: micro_groups.max(1),
            widest_stage,
            next_pass: 0,
            next_seq: 0,
            unsettled: false,
            in_flight: 0,
            pace: Default::default(),
            prefix_refused: false,
        }
    }

    /// Begins a new epoch of the same members: every stage drops its
    /// caches when the first pass of it comes, and replies of the old one
    /// are ignored.
    pub fn restart(&mut self) {
        self.next_epoch(self.epoch + 1);
    }

    /// Begins epoch `epoch` of a re-formed group, or the next one when
    /// `epoch` is not newer than the current; its members may share
    /// prefixes again.
    pub fn begin(&mut self, epoch: u64) {
        self.next_epoch(epoch);
        self.prefix_refused = false;
    }

    fn next_epoch(&mut self, epoch: u64) {
        self.epoch = epoch.max(self.epoch + 1);
        self.next_pass = 0;
        self.next_seq = 0;
        self.unsettled = false;
    }
}

struct Seq {
    id: u64,
    index: usize,
    prompt: Vec<u32>,
    read: usize,
    cache: KvCache,
    out: Vec<u32>,
    params: SamplingParams,
    bytes: usize,
    opened: bool,
    /// The shared prefix's sequence, when the cache began as its copy.
    prefix_of: Option<u64>,
}

/// One micro-batch group: its sequences and its pass in flight (the
/// positions of the sequences stepped, and whether each samples).
#[derive(Default)]
struct Micro {
    seqs: Vec<Seq>,
    flight: Option<(u64, Vec<(usize, bool)>)>,
}

/// Runs `work` on the group `split` from its first stage `first` (until
/// `control.stop`), handing each finished record to `done` as soon as it
/// ends.
#[allow(clippy::too_many_arguments)]
pub fn generate_split(
    first: &Llama,
    tokenizer: &GgufTokenizer,
    work: Vec<Prepared>,
    limits: GenLimits,
    split: &mut Split,
    control: &GenControl,
    link: &mut dyn StageLink,
    done: &mut dyn FnMut(usize, Generation),
) -> Result<(), ModelError> {
    let mut micros = Vec::new();
    let r = drive(
        first,
        tokenizer,
        work,
        limits,
        split,
        control,
        link,
        done,
        &mut micros,
    );
    split.in_flight = micros.iter().map(|m| m.seqs.len()).sum();
    r
}

/// [`generate_split`]'s loop, its micro-batch groups kept in `micros`.
#[allow(clippy::too_many_arguments)]
fn drive(
    first: &Llama,
    tokenizer: &GgufTokenizer,
    work: Vec<Prepared>,
    limits: GenLimits,
    split: &mut Split,
    control: &GenControl,
    link: &mut dyn StageLink,
    done: &mut dyn FnMut(usize, Generation),
    micros: &mut Vec<Micro>,
) -> Result<(), ModelError> {
    let cfg = first.config();
    if first.layers().start != 0 || first.layers().end == cfg.layers {
        return Err(ModelError::Invalid {
            family: "llm-generation",
            reason: format!(
                "layers {:?} of {} are not a first stage of a split model",
                first.layers(),
                cfg.layers
            ),
        });
    }
    if split.unsettled {
        split.restart();
    }
    let per_token = cfg.kv_bytes_per_token() / cfg.layers.max(1) * split.widest_stage.max(1);
    let groups = split.micro_groups.max(1);
    let chunk = limits.prefill_chunk.max(1);
    let mut used = 0usize;
    *micros = (0..groups).map(|_| Micro::default()).collect();
    let mut ended: Vec<u64> = Vec::new();
    split.unsettled = true;
    let shared = if first.reads_in_parts_exactly() && !split.prefix_refused {
        shared_prefix(&work, chunk)
    } else {
        0
    };
    let prefix = match work.first() {
        Some(p) if shared > 0 => {
            let tokens = p.prompt[..shared].to_vec();
            let (id, cache) = match read_prefix(first, &tokens, &p.params, split, control, link) {
                Ok(read) => read,
                Err(_) if control.stop.load(Ordering::Relaxed) => return Ok(()),
                Err(e) => return Err(e),
            };
            used += shared * per_token;
            Some((tokens, id, cache))
        }
        _ => None,
    };
    let mut pending: VecDeque<Prepared> = work.into();
    loop {
        if control.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        for g in 0..groups {
            if micros[g].flight.is_some() {
                continue;
            }
            // Admit records, spreading them over the micro-batch groups.
            let running: usize = micros.iter().map(|m| m.seqs.len()).sum();
            let want = limits.max_seqs.max(1).min(running + pending.len());
            let share = want.div_ceil(groups);
            let mut running = running;
            while micros[g].seqs.len() < share && running < limits.max_seqs.max(1) {
                let Some(next) = pending.front() else { break };
                let tokens = next.prompt.len() + next.params.max_tokens as usize;
                let bytes = tokens * per_token;
                if running > 0 && used + bytes > limits.kv_budget_bytes {
                    break;
                }
                let Some(p) = pending.pop_front() else { break };
                let mut cache = match first.new_cache(tokens) {
                    Ok(c) => c,
                    Err(ModelError::BadInput(m)) => {
                        done(p.index, Generation::failed(m));
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let mut prefix_of = None;
                if let Some((tokens, id, from)) = &prefix
                    && p.prompt.starts_with(tokens)
                    && tokens.len() <= shareable(p.prompt.len(), chunk)
                {
                    first.copy_prefix(&mut cache, from, tokens.len())?;
                    prefix_of = Some(*id);
                    control
                        .prompt_read
                        .fetch_add(tokens.len() as u64, Ordering::Relaxed);
                }
                used += bytes;
                running += 1;
                micros[g].seqs.push(Seq {
                    id: split.next_seq,
                    index: p.index,
                    read: prefix_of.map_or(0, |_| cache.len()),
                    prompt: p.prompt,
                    cache,
                    out: Vec::new(),
                    params: p.params,
                    bytes,
                    opened: false,
                    prefix_of,
                });
                split.next_seq += 1;
            }
            if micros[g].seqs.is_empty() {
                continue;
            }
            let pass = launch(
                first,
                g,
                &mut micros[g],
                split,
                &limits,
                &mut ended,
                control,
            )?;
            link.send(pass)?;
        }
        if micros.iter().all(|m| m.flight.is_none()) {
            break;
        }
        let reply = match link.recv(&control.stop) {
            Ok(r) => r,
            Err(_) if control.stop.load(Ordering::Relaxed) => return Ok(()),
            Err(e) => return Err(e),
        };
        if reply.epoch < split.epoch {
            continue;
        }
        let Some(g) = check(&reply, split, micros)? else {
            continue;
        };
        let m = &mut micros[g];
        let Some((_, stepped)) = m.flight.take() else {
            continue;
        };
        let mut tokens = reply.tokens.iter();
        let mut finished = Vec::new();
        for (at, sample) in stepped {
            if !sample {
                continue;
            }
            let Some(&next) = tokens.next() else {
                return Err(ModelError::StageLost(format!(
                    "the reply to pass {} holds too few tokens",
                    reply.pass
                )));
            };
            let s = &mut m.seqs[at];
            let before = s.out.len();
            let end = advance(&mut s.out, s.prompt.len(), &s.params, next, tokenizer);
            control
                .generated
                .fetch_add((s.out.len() - before) as u64, Ordering::Relaxed);
            if let Some(result) = end {
                finished.push((at, result));
            }
        }
        finished.sort_by_key(|(at, _)| *at);
        for (at, result) in finished.into_iter().rev() {
            let s = m.seqs.remove(at);
            used -= s.bytes;
            ended.push(s.id);
            done(s.index, result);
        }
    }
    // The caches of the records that ended, and the shared prefix's, are
    // dropped with a last, empty pass, whose answer also shows every stage
    // took them.
    if let Some((_, id, _)) = &prefix {
        ended.push(*id);
    }
    if !ended.is_empty() {
        let pass = StagePass {
            v: SCHEMA_VERSION,
            group: split.group.clone(),
            epoch: split.epoch,
            pass: split.next_pass,
            micro: 0,
            ended,
            steps: Vec::new(),
            width: cfg.hidden as u32,
            hidden: Vec::new(),
        };
        split.next_pass += 1;
        let want = pass.pass;
        link.send(pass)?;
        match await_lone(link, split, want, "closing pass", control) {
            Ok(None) => {}
            Ok(Some(refusal)) => return Err(ModelError::StageLost(refusal)),
            Err(_) if control.stop.load(Ordering::Relaxed) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    split.unsettled = false;
    Ok(())
}

/// Reads the shared prefix `tokens` as a sequence of its own through every
/// stage, before any other pass of the run, and waits for the last stage's
/// answer; returns the sequence and the first stage's cache of it. A stage
/// that refuses it turns sharing off until the group is re-formed.
fn read_prefix(
    first: &Llama,
    tokens: &[u32],
    params: &SamplingParams,
    split: &mut Split,
    control: &GenControl,
    link: &mut dyn StageLink,
) -> Result<(u64, KvCache), ModelError> {
    let mut cache = first.new_cache(tokens.len())?;
    let out = first.forward_stage(
        &mut [Step {
            cache: &mut cache,
            tokens,
        }],
        None,
        false,
    )?;
    let StageOut::Hidden(h) = out else {
        return Err(ModelError::Invalid {
            family: "llm-generation",
            reason: "the first stage of a split holds the head".into(),
        });
    };
    let hidden = h.flatten_all()?.to_vec1::<f32>()?;
    let id = split.next_seq;
    split.next_seq += 1;
    let want = split.next_pass;
    split.next_pass += 1;
    link.send(StagePass {
        v: SCHEMA_VERSION,
        group: split.group.clone(),
        epoch: split.epoch,
        pass: want,
        micro: 0,
        ended: Vec::new(),
        steps: vec![StageStep {
            seq: id,
            start: 0,
            tokens: tokens.len() as u32,
            sample: false,
            open: Some(StageOpen {
                capacity: tokens.len() as u32,
                params: params.clone(),
                prefix_of: None,
                shared: true,
            }),
        }],
        width: first.config().hidden as u32,
        hidden: StagePass::hidden_bytes(&hidden),
    })?;
    match await_lone(link, split, want, "prefix's pass", control)? {
        None => Ok((id, cache)),
        Some(refusal) => {
            split.prefix_refused = true;
            Err(ModelError::StageLost(format!(
                "the shared prefix was refused ({refusal}); prompts are read whole from now on"
            )))
        }
    }
}

/// Waits for the answer to pass `want` (`what`, sent with nothing else in
/// flight), which samples nothing; replies of older epochs are skipped.
/// `Some` holds a stage's refusal of it; an error is a lost link or a
/// reply out of turn.
fn await_lone(
    link: &mut dyn StageLink,
    split: &Split,
    want: u64,
    what: &str,
    control: &GenControl,
) -> Result<Option<String>, ModelError> {
    loop {
        let reply = link.recv(&control.stop)?;
        if reply.epoch < split.epoch {
            continue;
        }
        if reply.error.is_some() {
            return Ok(reply.error);
        }
        if reply.epoch == split.epoch && reply.pass == want && reply.tokens.is_empty() {
            return Ok(None);
        }
        return Err(ModelError::StageLost(format!(
            "a reply to pass {} of epoch {} came where the {what} {want} was awaited",
            reply.pass, reply.epoch
        )));
    }
}

/// The micro-batch group a reply answers; an error when it answers no
/// pass in flight, or carries a stage's refusal.
fn check(reply: &StageReply, split: &Split, micros: &[Micro]) -> Result<Option<usize>, ModelError> {
    if let Some(e) = &reply.error {
        return Err(ModelError::StageLost(e.clone()));
    }
    if reply.epoch != split.epoch || reply.group != split.group {
        return Err(ModelError::StageLost(format!(
            "a reply of group {:?} epoch {} where group {:?} is in epoch {}",
            reply.group, reply.epoch, split.group, split.epoch
        )));
    }
    let Some(g) = micros
        .iter()
        .position(|m| m.flight.as_ref().is_some_and(|(p, _)| *p == reply.pass))
    else {
        return Err(ModelError::StageLost(format!(
            "a reply to pass {}, which is not in flight",
            reply.pass
        )));
    };
    let asked = micros[g]
        .flight
        .as_ref()
        .map_or(0, |(_, s)| s.iter().filter(|(_, sample)| *sample).count());
    if reply.tokens.len() != asked {
        return Err(ModelError::StageLost(format!(
            "the reply to pass {} holds {} tokens for {asked} steps that sample",
            reply.pass,
            reply.tokens.len()
        )));
    }
    Ok(Some(g))
}

/// Plans the group's next pass, reads it through the first stage's layers
/// and returns it for the next stage; marks it in flight.
fn launch(
    first: &Llama,
    g: usize,
    m: &mut Micro,
    split: &mut Split,
    limits: &GenLimits,
    ended: &mut Vec<u64>,
    control: &GenControl,
) -> Result<StagePass, ModelError> {
    let plan = plan_pass(
        m.seqs.iter().map(|s| (s.read, s.prompt.len())),
        limits.pass_tokens,
        limits.prefill_chunk.max(1),
    );
    let mut steps = Vec::new();
    let mut wire = Vec::new();
    let mut stepped = Vec::new();
    for (i, (s, p)) in m.seqs.iter_mut().zip(&plan).enumerate() {
        let Some(p) = p else { continue };
        let Seq {
            cache, prompt, out, ..
        } = s;
        let (tokens, sample): (&[u32], bool) = match p {
            Plan::Decode => (&out[out.len() - 1..], true),
            Plan::Prefill(r) => (&prompt[r.clone()], r.end == prompt.len()),
        };
        wire.push(StageStep {
            seq: s.id,
            start: cache.len() as u32,
            tokens: tokens.len() as u32,
            sample,
            open: (!s.opened).then(|| StageOpen {
                capacity: cache.capacity() as u32,
                params: s.params.clone(),
                prefix_of: s.prefix_of,
                shared: false,
            }),
        });
        steps.push(Step { cache, tokens });
        stepped.push((i, sample));
    }
    let rows: u64 = steps.iter().map(|s| s.tokens.len() as u64).sum();
    let started = std::time::Instant::now();
    let out = first.forward_stage(&mut steps, None, false)?;
    split
        .pace
        .record(started.elapsed(), first.layers().len(), rows);
    let hidden = match out {
        StageOut::Hidden(h) => h.flatten_all()?.to_vec1::<f32>()?,
        StageOut::Logits(_) => {
            return Err(ModelError::Invalid {
                family: "llm-generation",
                reason: "the first stage of a split holds the head".into(),
            });
        }
    };
    drop(steps);
    for (s, p) in m.seqs.iter_mut().zip(&plan) {
        if let Some(Plan::Prefill(r)) = p {
            s.read = r.end;
            control
                .prompt_read
                .fetch_add(r.len() as u64, Ordering::Relaxed);
        }
        if p.is_some() {
            s.opened = true;
        }
    }
    let pass = StagePass {
        v: SCHEMA_VERSION,
        group: split.group.clone(),
        epoch: split.epoch,
        pass: split.next_pass,
        micro: g as u32,
        ended: std::mem::take(ended),
        steps: wire,
        width: first.config().hidden as u32,
        hidden: StagePass::hidden_bytes(&hidden),
    };
    m.flight = Some((split.next_pass, stepped));
    split.next_pass += 1;
    Ok(pass)
}
