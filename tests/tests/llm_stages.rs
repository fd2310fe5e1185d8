//! A language model split by layers: the real SmolLM2-135M-Instruct Q4_1
//! loaded as stages (15/15, 7/23 and 10/10/10 of its 30 layers), each
//! reading only its own tensors and holding only its own layers' caches,
//! with each stage's hidden states handed on in f32, gives the whole
//! model's logits bit for bit: prompts read together in one pass, then
//! greedy decoding a token a pass; on the device path (the code Metal and
//! CUDA run) too. A stage handed the wrong states, or a cache made for
//! another stage, refuses them.

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
