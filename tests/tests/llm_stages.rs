//! A language model split by layers: the real SmolLM2-135M-Instruct Q4_1
//! loaded as stages (15/15, 7/23 and 10/10/10 of its 30 layers), each
//! reading only its own tensors and holding only its own layers' caches,
//! with each stage's hidden states handed on in f32, gives the whole
//! model's logits bit for bit: prompts read together in one pass, then
//! greedy decoding a token a pass; on the device path (the code Metal and
//! CUDA run) too. A stage handed the wrong states, or a cache made for
//! another stage, refuses them.
//!
//! Then the stages as a group (threads joined by channels that carry the
//! same checksummed parts NATS carries): the first stage drives continuous
//! batching with several micro-batch groups in flight, the last samples,
//! and every record's tokens and text equal the whole model's, greedy and
//! seeded. A garbled part, a replayed pass and a step that does not
//! continue a cache are refused; a run broken by a garbled part is rerun
//! in a new epoch and still equals the whole model.

use std::sync::Mutex;

use candle_core::{Device, Tensor};
use minions_tests::{Result, chat_records, greedy_cases, real_gguf};
use minions_worker::model::llm::GgufGenerator;
use minions_worker::model::llm::gguf::GgufFile;
use minions_worker::model::llm::llama::{KvCache, Llama, StageOut, Step, argmax};

/// Prompts read together, then this many tokens decoded one pass at a time.
const PROMPTS: usize = 6;
const NEW_TOKENS: usize = 8;

/// The tokenizer and the prompts, once per file.
fn prompts() -> Result<Vec<Vec<u32>>> {
    static PROMPTS_READ: Mutex<Option<Vec<Vec<u32>>>> = Mutex::new(None);
    let mut slot = PROMPTS_READ.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = slot.as_ref() {
        return Ok(p.clone());
    }
    let generator = GgufGenerator::load(&real_gguf()?, &Device::Cpu)?;
    let records = chat_records(&greedy_cases()?[..PROMPTS], NEW_TOKENS as u32)?;
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        out.push(generator.prepare(i, r)?.prompt);
    }
    *slot = Some(out.clone());
    Ok(out)
}

/// The model as stages over `bounds` (`[0, a, b, …, layers]`), on the
/// fast path.
fn stages(bounds: &[usize]) -> Result<Vec<Llama>> {
    stages_on(bounds, minions_worker::model::EnginePath::Fast)
}

/// The model as stages over `bounds`, running the code `path` names.
fn stages_on(bounds: &[usize], path: minions_worker::model::EnginePath) -> Result<Vec<Llama>> {
    let mut file = GgufFile::open(&real_gguf()?)?;
    let mut out = Vec::new();
    for w in bounds.windows(2) {
        out.push(Llama::load_stage(
            &mut file,
            &Device::Cpu,
            path,
            w[0]..w[1],
        )?);
    }
    Ok(out)
}

/// What a run gave: every pass's logits as bits, and each sequence's
/// greedy tokens.
struct Ran {
    bits: Vec<Vec<u32>>,
    tokens: Vec<Vec<u32>>,
}

/// Runs the prompts through `stages` (a whole model is one stage).
fn run(stages: &[Llama], prompts: &[Vec<u32>], new_tokens: usize) -> Result<Ran> {
    // caches[stage][sequence]
    let mut caches: Vec<Vec<KvCache>> = stages
        .iter()
        .map(|m| {
            prompts
                .iter()
                .map(|p| m.new_cache(p.len() + new_tokens))
                .collect::<std::result::Result<Vec<_>, _>>()
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut reads: Vec<Vec<u32>> = prompts.to_vec();
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut bits = Vec::new();
    for _ in 0..new_tokens {
        let mut hidden: Option<Tensor> = None;
        let mut logits = None;
        for (m, stage_caches) in stages.iter().zip(caches.iter_mut()) {
            let mut steps: Vec<Step<'_>> = stage_caches
                .iter_mut()
                .zip(&reads)
                .map(|(cache, t)| Step { cache, tokens: t })
                .collect();
            match m.forward_stage(&mut steps, hidden.as_ref(), false)? {
                StageOut::Hidden(h) => hidden = Some(h),
                StageOut::Logits(l) => logits = Some(l),
            }
        }
        let logits = logits.ok_or("no stage held the head")?;
        let mut pass = Vec::new();
        for (i, out) in tokens.iter_mut().enumerate() {
            let row = Llama::row(&logits, i)?;
            pass.extend(row.iter().map(|x| x.to_bits()));
            out.push(argmax(&row));
        }
        bits.push(pass);
        reads = tokens.iter().map(|t| vec![t[t.len() - 1]]).collect();
    }
    Ok(Ran { bits, tokens })
}

#[test]
fn stages_give_the_whole_models_logits_bit_for_bit() -> Result<()> {
    let prompts = prompts()?;
    let whole = stages(&[0, 30])?;
    assert_eq!(whole[0].config().layers, 30);
    let want = run(&whole, &prompts, NEW_TOKENS)?;
    for bounds in [&[0, 15, 30][..], &[0, 7, 30], &[0, 10, 20, 30]] {
        let split = stages(bounds)?;
        let got = run(&split, &prompts, NEW_TOKENS)?;
        assert_eq!(got.tokens, want.tokens, "split {bounds:?}");
        assert!(got.bits == want.bits, "split {bounds:?}: logits differ");
        eprintln!(
            "split {bounds:?}: {} passes of {} sequences, logits equal bit for bit; layers held {:?}",
            NEW_TOKENS,
            prompts.len(),
            split.iter().map(Llama::layers).collect::<Vec<_>>()
        );
    }
    // The code a GPU runs, split too (candle's ops on the CPU are slow:
    // fewer sequences and tokens).
    let device = minions_worker::model::EnginePath::Device;
    let few = &prompts[..2];
    let want = run(&stages_on(&[0, 30], device)?, few, 3)?;
    let got = run(&stages_on(&[0, 15, 30], device)?, few, 3)?;
    assert_eq!(got.tokens, want.tokens, "device path");
    assert!(got.bits == want.bits, "device path: logits differ");
    eprintln!("device path, split [0, 15, 30]: logits equal bit for bit");
    Ok(())
}

#[test]
fn a_stage_refuses_states_and_caches_not_its_own() -> Result<()> {
    let split = stages(&[0, 10, 30])?;
    let (first, last) = (&split[0], &split[1]);
    let prompt = [1u32, 2, 3];
    // The last stage's cache in the first stage's pass.
    let mut cache = last.new_cache(8)?;
    let mut steps = [Step {
        cache: &mut cache,
        tokens: &prompt,
    }];
    let e = first.forward_stage(&mut steps, None, false).err();
    assert!(
        e.as_ref()
            .is_some_and(|e| e.to_string().contains("made for another stage")),
        "{e:?}"
    );
    // Hidden states of the wrong shape, and none at all.
    let hidden = first.config().hidden;
    let mut cache = last.new_cache(8)?;
    let wrong = Tensor::zeros((2, hidden), candle_core::DType::F32, &Device::Cpu)?;
    for given in [Some(&wrong), None] {
        let mut steps = [Step {
            cache: &mut cache,
            tokens: &prompt,
        }];
        let e = last.forward_stage(&mut steps, given, false).err();
        assert!(e.is_some(), "{given:?} was taken");
        assert_eq!(cache.len(), 0, "a refused pass moved the cache");
    }
    // The whole-model call on a stage without the head.
    let mut cache = first.new_cache(8)?;
    let mut steps = [Step {
        cache: &mut cache,
        tokens: &prompt,
    }];
    assert!(first.forward(&mut steps, false).is_err());
    Ok(())
}

mod group {
    use std::sync::mpsc::{Receiver, Sender, channel};
    use std::time::Duration;

    use minions_schemas::messages::{Generation, GenerationRecord, StagePass};
    use minions_worker::model::llm::generate::{GenControl, GenLimits, generate};
    use minions_worker::model::llm::pipeline::{Split, StageLink, generate_split};
    use minions_worker::model::llm::stage::StageServer;
    use minions_worker::model::llm::stage_wire::{
        Outgoing, ReplyReader, StageEnd, Taken, pass_parts,
    };
    use minions_worker::model::{EnginePath, ModelError};

    use super::*;

    /// Later stages on threads; parts go through channels as they would
    /// through NATS. `garble` flips a byte in the part with that number
    /// sent to the second stage; `on_prefix` counts the sequences opened
    /// on a shared prefix.
    struct ThreadLink {
        to_second: Sender<Vec<u8>>,
        replies: Receiver<Vec<u8>>,
        reader: ReplyReader,
        sent: usize,
        garble: Option<usize>,
        on_prefix: usize,
    }

    impl StageLink for ThreadLink {
        fn send(&mut self, pass: StagePass) -> std::result::Result<(), ModelError> {
            self.on_prefix += pass
                .steps
                .iter()
                .filter(|s| s.open.as_ref().is_some_and(|o| o.prefix_of.is_some()))
                .count();
            for mut part in pass_parts(&pass)? {
                if self.garble == Some(self.sent) {
                    let at = part.len() - 3;
                    part[at] ^= 0x10;
                }
                self.sent += 1;
                self.to_second
                    .send(part)
                    .map_err(|e| ModelError::StageLost(e.to_string()))?;
            }
            Ok(())
        }

        fn recv(
            &mut self,
            _stop: &std::sync::atomic::AtomicBool,
        ) -> std::result::Result<minions_schemas::messages::StageReply, ModelError> {
            loop {
                let part = self
                    .replies
                    .recv_timeout(Duration::from_secs(60))
                    .map_err(|e| ModelError::StageLost(e.to_string()))?;
                if let Some(r) = self.reader.take(&part)? {
                    return Ok(r);
                }
            }
        }
    }

    /// The group over `bounds`: its first stage and a link to the others
    /// (running the code `later` names), which run until the link is
    /// dropped.
    fn group(
        bounds: &[usize],
        later: EnginePath,
        garble: Option<usize>,
    ) -> Result<(Llama, ThreadLink)> {
        let first = stages_on(&bounds[..2], EnginePath::Fast)?
            .pop()
            .ok_or("no stage")?;
        let loaded = stages_on(&bounds[1..], later)?.into_iter();
        let (to_first, replies) = channel::<Vec<u8>>();
        let later: Vec<Llama> = loaded.collect();
        let mut inboxes = Vec::new();
        let mut outs = Vec::new();
        for _ in &later {
            let (tx, rx) = channel::<Vec<u8>>();
            outs.push(tx);
            inboxes.push(rx);
        }
        let to_second = outs.first().cloned().ok_or("one stage")?;
        let mut next_of: Vec<Option<Sender<Vec<u8>>>> =
            outs.into_iter().skip(1).map(Some).collect();
        next_of.push(None);
        for (k, ((model, inbox), next)) in later.into_iter().zip(inboxes).zip(next_of).enumerate() {
            let mut end = StageEnd::new(StageServer::new(model, "g")?, k + 1);
            let to_first = to_first.clone();
            std::thread::spawn(move || {
                while let Ok(part) = inbox.recv() {
                    let parts = match end.take(&part) {
                        Ok(Taken::Send(Outgoing::Next(p))) => (p, next.as_ref()),
                        Ok(Taken::Send(Outgoing::First(p))) => (p, Some(&to_first)),
                        Ok(Taken::Partial | Taken::Dropped(_)) => continue,
                        Err(e) => panic!("stage {}: {e}", k + 1),
                    };
                    let (parts, to) = parts;
                    for p in parts {
                        if to.is_none_or(|t| t.send(p).is_err()) {
                            return;
                        }
                    }
                }
            });
        }
        let link = ThreadLink {
            to_second,
            replies,
            reader: ReplyReader::default(),
            sent: 0,
            garble,
            on_prefix: 0,
        };
        Ok((first, link))
    }

    /// Records: the first `n` chat cases, greedy, or sampled with a seed
    /// of their own.
    fn records(n: usize, sampled: bool) -> Result<Vec<GenerationRecord>> {
        let mut out = chat_records(&greedy_cases()?[..n], 12)?;
        if sampled {
            for (i, r) in out.iter_mut().enumerate() {
                r.params.temperature = 0.8;
                r.params.top_p = 0.95;
                r.params.seed = 1000 + i as u64;
            }
        }
        Ok(out)
    }

    fn limits() -> GenLimits {
        GenLimits {
            max_seqs: 8,
            pass_tokens: 96,
            prefill_chunk: 32,
            ..GenLimits::default()
        }
    }

    /// The whole model, loaded once per file.
    pub(super) fn generator() -> Result<&'static GgufGenerator> {
        static LOADED: std::sync::OnceLock<GgufGenerator> = std::sync::OnceLock::new();
        if let Some(g) = LOADED.get() {
            return Ok(g);
        }
        let g = GgufGenerator::load(&real_gguf()?, &Device::Cpu)?;
        Ok(LOADED.get_or_init(|| g))
    }

    /// What the whole model gives.
    fn whole(records: &[GenerationRecord]) -> Result<Vec<Option<Generation>>> {
        let generator = generator()?;
        let work = records
            .iter()
            .enumerate()
            .map(|(i, r)| generator.prepare(i, r))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut got = vec![None; records.len()];
        generate(
            generator.model(),
            generator.tokenizer(),
            work,
            limits(),
            &GenControl::default(),
            &mut |i, g| got[i] = Some(g),
        )?;
        Ok(got)
    }

    /// What a group's run gave: each record's result, the runs it took
    /// and the sequences opened on a shared prefix.
    struct SplitRan {
        got: Vec<Option<Generation>>,
        runs: usize,
        on_prefix: usize,
    }

    /// What the group over `bounds` (its later stages on `later`) gives
    /// with `micro` micro-batch groups; a run that fails is run again, in
    /// a new epoch, for the records it did not finish.
    fn split_run(
        records: &[GenerationRecord],
        bounds: &[usize],
        later: EnginePath,
        micro: usize,
        garble: Option<usize>,
    ) -> Result<SplitRan> {
        let generator = generator()?;
        let (first, mut link) = group(bounds, later, garble)?;
        let widest = bounds.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(1);
        let mut split = Split::new("g", 1, micro, widest);
        let mut got: Vec<Option<Generation>> = vec![None; records.len()];
        for run in 1..=3 {
            let work = records
                .iter()
                .enumerate()
                .filter(|(i, _)| got[*i].is_none())
                .map(|(i, r)| generator.prepare(i, r))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let r = generate_split(
                &first,
                generator.tokenizer(),
                work,
                limits(),
                &mut split,
                &GenControl::default(),
                &mut link,
                &mut |i, g| {
                    assert!(got[i].is_none(), "record {i} finished twice");
                    got[i] = Some(g);
                },
            );
            match r {
                Ok(()) => {
                    return Ok(SplitRan {
                        got,
                        runs: run,
                        on_prefix: link.on_prefix,
                    });
                }
                Err(ModelError::StageLost(why)) => {
                    eprintln!("run {run} ended: {why}");
                    split.restart();
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err("three runs did not finish".into())
    }

    #[test]
    fn a_group_gives_the_whole_models_records_greedy_and_seeded() -> Result<()> {
        let greedy: &[(&[usize], usize)] = &[(&[0, 15, 30], 2)];
        let seeded: &[(&[usize], usize)] = &[(&[0, 7, 30], 1), (&[0, 10, 20, 30], 3)];
        for (sampled, splits) in [(false, greedy), (true, seeded)] {
            let records = records(6, sampled)?;
            let want = whole(&records)?;
            assert!(want.iter().all(Option::is_some));
            for &(bounds, micro) in splits {
                let ran = split_run(&records, bounds, EnginePath::Fast, micro, None)?;
                assert_eq!(ran.runs, 1);
                // The chat template's system prompt is read once.
                assert!(ran.on_prefix > 0, "no sequence opened on the shared prefix");
                assert_eq!(
                    ran.got, want,
                    "split {bounds:?}, {micro} micro-batch groups, sampled {sampled}"
                );
                eprintln!(
                    "split {bounds:?}, {micro} micro-batch groups, sampled {sampled}: {} records equal the whole model's",
                    records.len()
                );
            }
        }
        Ok(())
    }

    #[test]
    fn a_garbled_part_ends_the_epoch_and_the_rerun_still_equals_the_whole_model() -> Result<()> {
        let records = records(6, true)?;
        let want = whole(&records)?;
        let ran = split_run(&records, &[0, 10, 20, 30], EnginePath::Fast, 2, Some(9))?;
        assert_eq!(ran.runs, 2, "the garbled part went unnoticed");
        assert_eq!(ran.got, want);
        Ok(())
    }

    #[test]
    fn a_stage_that_cannot_read_a_prompt_in_parts_turns_prefix_sharing_off() -> Result<()> {
        // The second stage on candle's ops, whose sums change with a
        // prompt read in parts: it refuses the shared prefix, and the rerun
        // reads every prompt whole.
        let records = records(4, false)?;
        let ran = split_run(&records, &[0, 15, 30], EnginePath::Device, 2, None)?;
        assert_eq!(ran.runs, 2, "the prefix was not refused");
        assert_eq!(ran.on_prefix, 0, "sequences opened on a refused prefix");
        for (i, g) in ran.got.iter().enumerate() {
            let g = g.as_ref().ok_or(format!("record {i} did not finish"))?;
            assert!(g.error.is_none(), "record {i}: {:?}", g.error);
            assert!(g.completion_tokens > 0, "record {i} generated nothing");
        }
        Ok(())
    }

    /// A pass of `steps` (sequence, start, tokens, opens) for the middle
    /// stage of a 30-layer model.
    fn pass(epoch: u64, number: u64, steps: &[(u64, u32, u32, bool)]) -> StagePass {
        use minions_schemas::messages::{StageOpen, StageStep};
        let rows: u32 = steps.iter().map(|s| s.2).sum();
        let values: Vec<f32> = (0..rows as usize * 576)
            .map(|i| ((i % 97) as f32 - 48.0) * 0.01)
            .collect();
        StagePass {
            v: minions_schemas::SCHEMA_VERSION,
            group: "g".into(),
            epoch,
            pass: number,
            micro: 0,
            ended: vec![],
            steps: steps
                .iter()
                .map(|&(seq, start, tokens, open)| StageStep {
                    seq,
                    start,
                    tokens,
                    sample: true,
                    open: open.then(|| StageOpen {
                        capacity: 16,
                        params: minions_schemas::messages::SamplingParams {
                            max_tokens: 8,
                            temperature: 0.0,
                            top_p: 1.0,
                            top_k: 0,
                            seed: 0,
                            stop: vec![],
                        },
                        prefix_of: None,
                        shared: false,
                    }),
                })
                .collect(),
            width: 576,
            hidden: StagePass::hidden_bytes(&values),
        }
    }

    /// What the stage did with a whole pass: `Ok(forwarded)`, or the
    /// refusal it sent back, or `Err` when it dropped it unanswered.
    fn feed(
        end: &mut StageEnd,
        p: &StagePass,
        garble: bool,
    ) -> Result<std::result::Result<bool, String>> {
        let mut parts = pass_parts(p)?;
        if garble {
            let last = parts.len() - 1;
            let at = parts[last].len() / 2;
            parts[last][at] ^= 1;
        }
        let mut out = None;
        for part in parts {
            out = Some(end.take(&part)?);
        }
        Ok(match out.ok_or("no part")? {
            Taken::Send(Outgoing::Next(_)) => Ok(true),
            Taken::Send(Outgoing::First(parts)) => {
                let mut reader = ReplyReader::default();
                let mut reply = None;
                for p in parts {
                    reply = reader.take(&p)?;
                }
                Err(reply
                    .and_then(|r| r.error)
                    .ok_or("a reply without an error")?)
            }
            Taken::Dropped(why) => Err(format!("dropped: {why}")),
            Taken::Partial => Err("partial".into()),
        })
    }

    #[test]
    fn a_stage_refuses_garbled_stale_and_misplaced_passes() -> Result<()> {
        let model = stages(&[0, 10, 20, 30])?.swap_remove(1);
        let mut end = StageEnd::new(StageServer::new(model, "g")?, 1);
        let refused = |r: std::result::Result<bool, String>, says: &str| match r {
            Err(e) if e.contains(says) => Ok(()),
            other => Err(format!("expected a refusal saying {says:?}, got {other:?}")),
        };
        assert_eq!(
            feed(&mut end, &pass(1, 0, &[(1, 0, 3, true)]), false)?,
            Ok(true)
        );
        // Replayed: the same pass again, and an older one.
        refused(
            feed(&mut end, &pass(1, 0, &[(1, 3, 1, false)]), false)?,
            "dropped: stale pass 0",
        )?;
        // Garbled on the wire.
        refused(
            feed(&mut end, &pass(1, 1, &[(1, 3, 1, false)]), true)?,
            "garbled",
        )?;
        // A step that does not continue the sequence's cache, and a
        // sequence never opened: nothing moves.
        refused(
            feed(&mut end, &pass(1, 2, &[(1, 2, 1, false)]), false)?,
            "its cache here holds 3",
        )?;
        refused(
            feed(
                &mut end,
                &pass(1, 3, &[(1, 3, 1, false), (7, 5, 1, false)]),
                false,
            )?,
            "sequence 7 is unknown",
        )?;
        assert_eq!(
            feed(&mut end, &pass(1, 4, &[(1, 3, 1, false)]), false)?,
            Ok(true)
        );
        // Another group's pass.
        let mut other = pass(1, 5, &[(2, 0, 1, true)]);
        other.group = "h".into();
        refused(feed(&mut end, &other, false)?, "serves \"g\"")?;
        // A new epoch drops every cache; the old epoch is then stale.
        refused(
            feed(&mut end, &pass(2, 0, &[(1, 4, 1, false)]), false)?,
            "sequence 1 is unknown",
        )?;
        assert_eq!(end.server().sequences(), 0);
        refused(
            feed(&mut end, &pass(1, 9, &[(1, 4, 1, false)]), false)?,
            "dropped: stale",
        )?;
        assert_eq!(
            feed(&mut end, &pass(2, 1, &[(1, 0, 2, true)]), false)?,
            Ok(true)
        );
        // Sequences opened on a shared prefix: on one it holds, and not on
        // one it does not or past its end.
        let on = |number: u64, seq: u64, prefix: u64, start: u32| {
            let mut p = pass(2, number, &[(seq, start, 1, true)]);
            if let Some(o) = p.steps[0].open.as_mut() {
                o.prefix_of = Some(prefix);
            }
            p
        };
        assert_eq!(feed(&mut end, &on(2, 5, 1, 2), false)?, Ok(true));
        refused(
            feed(&mut end, &on(3, 6, 9, 2), false)?,
            "sequence 6 opens on sequence 9, which is unknown here",
        )?;
        refused(
            feed(&mut end, &on(4, 6, 1, 3), false)?,
            "whose cache here holds 2",
        )?;
        // A stage on candle's ops refuses a prefix to share.
        let device = stages_on(&[0, 10, 20], EnginePath::Device)?.swap_remove(1);
        let mut end = StageEnd::new(StageServer::new(device, "g")?, 1);
        let mut prefix = pass(2, 0, &[(1, 0, 2, true)]);
        if let Some(o) = prefix.steps[0].open.as_mut() {
            o.shared = true;
        }
        refused(
            feed(&mut end, &prefix, false)?,
            "do not read a prompt in parts",
        )?;
        Ok(())
    }
}

/// Groups of worker processes, formed by the watchdog.
mod fleet {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use minions_tests::{Fleet, log_count};
    use minions_worker::model::Model;
    use minions_worker::model::llm::{GenControl, GenLimits};

    use super::*;

    /// The first `n` chat cases as a JSONL input, ids `c0`, `c1`, ….
    fn write_cases(path: &Path, n: usize) -> Result<()> {
        let mut out = String::new();
        for (i, c) in greedy_cases()?[..n].iter().enumerate() {
            let line = serde_json::json!({"id": format!("c{i}"), "messages": c["messages"]});
            out.push_str(&line.to_string());
            out.push('\n');
        }
        std::fs::write(path, out)?;
        Ok(())
    }

    /// The same cases run on the whole model in this process, greedy as
    /// `submit` asks by default: their texts in input order.
    fn whole_texts(n: usize, max_tokens: u32) -> Result<Vec<String>> {
        let g = super::group::generator()?;
        let records = chat_records(&greedy_cases()?[..n], max_tokens)?;
        let indexed: Vec<_> = records.iter().enumerate().collect();
        let mut texts = vec![String::new(); n];
        g.generate(
            &indexed,
            GenLimits::default(),
            &GenControl::default(),
            &mut |i, r| texts[i] = r.text,
        )?;
        Ok(texts)
    }

    fn texts_of(fleet: &Fleet, job: &str) -> Result<Vec<String>> {
        let out = fleet.dir.path().join(format!("{job}.out.jsonl"));
        fleet.cli(&["collect", job, "--output", &out.display().to_string()])?;
        let mut texts = Vec::new();
        for (i, l) in std::fs::read_to_string(&out)?.lines().enumerate() {
            let v: serde_json::Value = serde_json::from_str(l)?;
            assert_eq!(
                v["id"],
                format!("c{i}"),
                "records in input order, each once"
            );
            texts.push(
                v["text"]
                    .as_str()
                    .ok_or("a record without text")?
                    .to_owned(),
            );
        }
        Ok(texts)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_job_split_over_worker_processes_equals_one_worker_and_outlives_a_lost_stage()
    -> Result<()> {
        let mut fleet = Fleet::local()?;
        let r = split_jobs(&mut fleet).await;
        fleet.explain(r)
    }

    async fn split_jobs(fleet: &mut Fleet) -> Result<()> {
        const CASES: usize = 24;
        const TOKENS: u32 = 24;
        fleet.push_smollm2("smollm2")?;
        let input = fleet.dir.path().join("cases.jsonl");
        write_cases(&input, CASES)?;
        fleet.add_watchdog(&[])?;
        // Each worker's owner, as a file its policy reads.
        let owned = |fleet: &mut Fleet, i: usize| -> Result<()> {
            let signal = fleet.dir.path().join(format!("owner{i}"));
            std::fs::write(&signal, "idle\n")?;
            let policy = fleet.dir.path().join(format!("policy{i}.toml"));
            std::fs::write(
                &policy,
                format!(
                    "signals = [\"file:{}\"]\nmin_input_idle_secs = 60\nresume_after_secs = 600\nsample_every_ms = 100\n",
                    signal.display()
                ),
            )?;
            // Each lends less than the model needs (113 MB, as submit
            // estimates it) and more than half of it.
            fleet.add_worker(&[
                "--lend-memory-mb",
                "80",
                "--slots",
                "1",
                "--checkpoint-secs",
                "1",
                "--max-seqs",
                "4",
                "--policy",
                &policy.display().to_string(),
            ])
        };
        for i in 1..=3 {
            owned(fleet, i)?;
        }
        let want = whole_texts(CASES, TOKENS)?;
        let submit_with = |fleet: &Fleet, job: &str, extra: &[&str]| {
            let input = input.display().to_string();
            let tokens = TOKENS.to_string();
            let mut args = vec![
                "submit",
                "--model",
                "smollm2",
                "--input",
                &input,
                "--shard-size",
                "12",
                "--max-tokens",
                &tokens,
                "--job",
                job,
            ];
            args.extend(extra);
            fleet.cli(&args)
        };
        let submit = |fleet: &Fleet, job: &str| submit_with(fleet, job, &["--stages", "2"]);
        // A group larger than the fleet: the job page says why it waits.
        let wide = submit_with(fleet, "wide", &["--stages", "4"])?;
        let page = format!("{}/api/jobs/{wide}", fleet.dashboards[0]);
        let until = Instant::now() + Duration::from_secs(30);
        let why = loop {
            let (code, body) = minions_tests::web::get(&page)?;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let texts: Vec<String> = v["waiting_because"]
                .as_array()
                .map(|a| a.iter().map(|r| r["text"].to_string()).collect())
                .unwrap_or_default();
            if code == 200
                && let Some(t) = texts.iter().find(|t| t.contains("waiting for a group"))
            {
                break t.clone();
            }
            assert!(
                Instant::now() < until,
                "the job page never said it waits for a group: {texts:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        eprintln!("a job asking for 4 stages of 3 workers: {why}");
        fleet.cli(&["cancel", &wide])?;
        // A whole job through a group of two processes, formed unasked:
        // no worker lends enough for the whole model.
        let job = submit_with(fleet, "split1", &[])?;
        // The members say which stage they hold.
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let list = fleet.cli(&["worker", "list"])?;
            if list.contains("holds stage 2 of 2 (layers 15..30) of g-split1") {
                break;
            }
            assert!(
                Instant::now() < until,
                "worker list never showed the group:\n{list}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let status = fleet.wait_job(&job, Duration::from_secs(600))?;
        assert_eq!(status["state"], "done");
        assert_eq!(
            texts_of(fleet, &job)?,
            want,
            "the group's texts differ from one worker's"
        );
        let lead = fleet
            .stage_worker(0, "split1")
            .ok_or("no worker led the group")?;
        let served = fleet
            .stage_worker(1, "split1")
            .ok_or("no worker served a stage")?;
        // Each member fetched only the pieces of the file its layers need.
        let sliced: Vec<String> = [lead, served]
            .iter()
            .map(|&w| {
                let log = std::fs::read_to_string(&fleet.workers[w].log).unwrap_or_default();
                let line = log
                    .lines()
                    .find(|l| l.contains("a stage's slice of the model is ready"))
                    .unwrap_or_default()
                    .to_owned();
                let field = |k: &str| {
                    line.split_whitespace()
                        .find_map(|x| x.strip_prefix(k))
                        .unwrap_or("?")
                        .to_owned()
                };
                format!("{} of {} pieces", field("pieces="), field("of="))
            })
            .collect();
        assert!(
            sliced.iter().all(|s| !s.starts_with('?')),
            "a member did not fetch a slice: {sliced:?}"
        );
        eprintln!(
            "split 2 ways, unasked, over worker{} and worker{}: {CASES} records equal one worker's; \
             the members fetched {} and {} of the file",
            lead + 1,
            served + 1,
            sliced[0],
            sliced[1]
        );
        // The second stage killed (SIGKILL) once the group has checkpointed
        // records: the spare takes its layers and the job completes, each
        // record once and equal.
        let before: Vec<usize> = fleet
            .workers
            .iter()
            .map(|w| log_count(&w.log, "checkpoint written"))
            .collect();
        let job = submit(fleet, "split2")?;
        let until = Instant::now() + Duration::from_secs(300);
        let (lead, served) = loop {
            if let (Some(l), Some(s)) = (
                fleet.stage_worker(0, "split2"),
                fleet.stage_worker(1, "split2"),
            ) && log_count(&fleet.workers[l].log, "checkpoint written") > before[l]
            {
                break (l, s);
            }
            assert!(
                Instant::now() < until,
                "the second group never checkpointed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let killed_at = Instant::now();
        fleet.workers[served].kill();
        let status = fleet.wait_job(&job, Duration::from_secs(600))?;
        assert_eq!(status["state"], "done");
        assert_eq!(
            texts_of(fleet, &job)?,
            want,
            "after a lost stage, the texts differ"
        );
        let watchdog = std::fs::read_to_string(&fleet.watchdogs[0].log)?;
        let reformed = watchdog
            .lines()
            .find(|l| l.contains("group re-formed"))
            .ok_or("the group was not re-formed")?;
        let lead_log = std::fs::read_to_string(&fleet.workers[lead].log)?;
        let ended: Vec<&str> = lead_log
            .lines()
            .filter(|l| l.contains("the group's epoch ended"))
            .collect();
        assert!(!ended.is_empty(), "the first stage never ended an epoch");
        let field = |line: &str, key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or("?")
                .to_owned()
        };
        // Its members had run split1's passes: their measured pace set
        // the layers (the logs show members as worker[first..end]).
        let formed = watchdog
            .lines()
            .find(|l| l.contains("group formed") && l.contains("g-split2"))
            .ok_or("no group formed for split2")?;
        eprintln!(
            "the second group, by the members' measured pace: {}",
            formed
                .split("members=")
                .nth(1)
                .and_then(|m| m.split(" ms=").next())
                .unwrap_or("?")
        );
        eprintln!(
            "second stage killed: the job completed {:.1} s later; the watchdog replaced it {} ms after it saw it lost; \
             the first stage ran {} record(s) in flight again ({} epoch(s) ended)",
            killed_at.elapsed().as_secs_f64(),
            field(reformed, "recovery_ms="),
            field(ended[0], "in_flight="),
            ended.len()
        );
        // The second stage's owner comes back, then the first stage is
        // killed, in one job: each is replaced by a spare, the first
        // stage's shard goes back to the queue and resumes from its
        // checkpoint on the new leader.
        owned(fleet, 4)?;
        owned(fleet, 5)?;
        let before: Vec<usize> = fleet
            .workers
            .iter()
            .map(|w| log_count(&w.log, "checkpoint written"))
            .collect();
        let job = submit(fleet, "split3")?;
        let until = Instant::now() + Duration::from_secs(300);
        let (lead, served) = loop {
            if let (Some(l), Some(s)) = (
                fleet.stage_worker(0, "split3"),
                fleet.stage_worker(1, "split3"),
            ) && log_count(&fleet.workers[l].log, "checkpoint written") > before[l]
            {
                break (l, s);
            }
            assert!(Instant::now() < until, "the third group never checkpointed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let back = Instant::now();
        std::fs::write(
            fleet.dir.path().join(format!("owner{}", served + 1)),
            "active\n",
        )?;
        while log_count(&fleet.workers[served].log, "left the group") == 0 {
            assert!(
                back.elapsed() < Duration::from_secs(10),
                "the stage was not given back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let given_back = back.elapsed();
        let lead_log = fleet.workers[lead].log.clone();
        let ended_before = log_count(&lead_log, "the group's epoch ended");
        let checkpoints = log_count(&lead_log, "checkpoint written");
        let until = Instant::now() + Duration::from_secs(120);
        while log_count(&lead_log, "the group's epoch ended") == ended_before
            || log_count(&lead_log, "checkpoint written") == checkpoints
        {
            assert!(
                Instant::now() < until,
                "the group did not go on after the owner's return"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        fleet.workers[lead].kill();
        let killed_at = Instant::now();
        let status = fleet.wait_job(&job, Duration::from_secs(600))?;
        assert_eq!(status["state"], "done");
        assert_eq!(
            texts_of(fleet, &job)?,
            want,
            "after an owner's return and a lost leader, the texts differ"
        );
        let new_lead = fleet
            .stage_workers(0, "split3")
            .into_iter()
            .find(|&i| i != lead)
            .ok_or("no new leader took the group")?;
        let resumed = std::fs::read_to_string(&fleet.workers[new_lead].log)?
            .lines()
            .filter(|l| l.contains("resuming from checkpoint"))
            .count();
        eprintln!(
            "second stage's owner back: the stage was given back in {} ms; then the first stage killed: \
             the job completed {:.1} s later on worker{} as leader ({resumed} shard(s) resumed from a checkpoint)",
            given_back.as_millis(),
            killed_at.elapsed().as_secs_f64(),
            new_lead + 1
        );
        Ok(())
    }
}
