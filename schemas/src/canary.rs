//! The canary: a small known shard every worker runs when it starts (so on
//! every new build, device or kernel path) before it pulls any work, and
//! whose answer the watchdogs know. A worker whose kernels give wrong
//! answers is refused before it touches a real shard.
//!
//! The shard is [`TEXTS`] embedded by a tiny BERT whose weights follow from
//! a fixed seed (the worker's engine builds it and loads it through the
//! same path as any model), at every precision; and, for the speech family,
//! a tiny Whisper of seeded weights (in CTranslate2's format, read by the
//! same reader as real ones) fed the log-mel of two seeded signals and a
//! fixed run of tokens, whose logits at every step are the answer
//! ([`SPEECH_STEPS`] rows per signal). The known answer,
//! [`reference`], was made once on the portable CPU path by
//! `make_canary_reference` (see `tests/bench/src/bin`) and is committed; an
//! answer matches when every vector's cosine to the known one reaches its
//! precision's [`Precision::min_cosine`], the tolerance sampled checks use.

use std::sync::OnceLock;

use serde::Deserialize;

use crate::messages::{CanaryAnswer, Precision};

/// The canary's texts, in order: words of the tiny model's vocabulary,
/// with one unknown word and one empty text.
pub const TEXTS: [&str; 8] = [
    "a man is eating food",
    "the quick brown fox jumps over the lazy dog",
    "two girls are riding a red bus in the city",
    "my laptop is sleeping on the office desk at night",
    "one shard, one worker, one job!",
    "zyxwv",
    "",
    "she reads a new book and drinks green tea in the morning by the river",
];

/// The seed the canary model's weights follow from.
pub const MODEL_SEED: u64 = 0x6d69_6e69_6f6e_7301;

/// The tokens the speech canary's decoder is fed, in order: the first
/// three as one prompt, then one a step. A fixed run, not the model's own
/// choices, so that a near tie cannot send two machines down different
/// paths.
pub const SPEECH_TOKENS: [u32; 8] = [1, 5, 9, 13, 17, 21, 25, 29];

/// Decoder steps of the speech canary, each giving one row of logits per
/// signal: the prompt, then every token after it.
pub const SPEECH_STEPS: usize = SPEECH_TOKENS.len() - 2;

/// Signals the speech canary transcribes side by side.
pub const SPEECH_SIGNALS: usize = 2;

/// The committed known answer, as `make_canary_reference` writes it.
#[derive(Debug, Deserialize)]
pub struct Reference {
    /// What made it (the portable CPU path).
    pub made_by: String,
    /// One answer per precision.
    pub answers: Vec<CanaryAnswer>,
    /// The speech canary's answer (f32).
    #[serde(default)]
    pub speech: Option<CanaryAnswer>,
}

const REFERENCE_JSON: &str = include_str!("../fixtures/canary.json");

/// The known answer, parsed once. `None` only if the committed fixture does
/// not parse, which a unit test rules out.
pub fn reference() -> Option<&'static Reference> {
    static REF: OnceLock<Option<Reference>> = OnceLock::new();
    REF.get_or_init(|| serde_json::from_str(REFERENCE_JSON).ok())
        .as_ref()
}

/// Judges `answers` (and the speech canary's `speech`) against the known
/// answer: `Ok` with how close they came, or `Err` naming the first
/// precision and text (or speech step) that is wrong. Every precision of
/// the known answer must be answered but the half precisions, and a speech
/// answer may be missing too: a report without them (a worker built before
/// the canary covered them) passes on the rest, and the verdict says what
/// was not checked.
pub fn judge(answers: &[CanaryAnswer], speech: Option<&CanaryAnswer>) -> Result<String, String> {
    let Some(known) = reference() else {
        return Err("this build's known canary answer does not parse".into());
    };
    let mut least = Vec::new();
    let mut unchecked = Vec::new();
    for want in &known.answers {
        let p = want.precision;
        let Some(got) = answers.iter().find(|a| a.precision == p) else {
            if ADDED_LATER.contains(&p) {
                unchecked.push(p.as_str());
                continue;
            }
            return Err(format!("no answer at {p}"));
        };
        let c = least_cosine(want, got, &|i| {
            format!("text {i} ({:?})", TEXTS.get(i).copied().unwrap_or("?"))
        })
        .map_err(|why| format!("at {p}: {why}"))?;
        least.push(format!("{p} {c:.6}"));
    }
    let speech = match (&known.speech, speech) {
        (None, _) => String::new(),
        (Some(want), Some(got)) => {
            let c = least_cosine(want, got, &|i| {
                format!("signal {}, step {}", i % SPEECH_SIGNALS, i / SPEECH_SIGNALS)
            })
            .map_err(|why| format!("speech: {why}"))?;
            least.push(format!("speech {c:.6}"));
            format!("; {} speech steps agree", SPEECH_STEPS * SPEECH_SIGNALS)
        }
        (Some(_), None) => {
            "; no speech answer (a worker built before the speech canary): speech not checked"
                .into()
        }
    };
    let unchecked = if unchecked.is_empty() {
        String::new()
    } else {
        format!(
            "; no {} answer (a worker built before the canary ran them): not checked",
            unchecked.join(" or ")
        )
    };
    Ok(format!(
        "{} texts agree with the known answer{speech}{unchecked} (least cosine: {})",
        TEXTS.len(),
        least.join(", ")
    ))
}

/// The least cosine between the rows of `want` and `got`, or why they
/// cannot match (`row` names a row in words).
fn least_cosine(
    want: &CanaryAnswer,
    got: &CanaryAnswer,
    row: &dyn Fn(usize) -> String,
) -> Result<f64, String> {
    let dim = want.dim as usize;
    if got.dim != want.dim || got.data.len() != want.data.len() || dim == 0 {
        return Err(format!(
            "{} values of dimension {}, the known answer has {} of {}",
            got.data.len(),
            got.dim,
            want.data.len(),
            want.dim
        ));
    }
    let min = want.precision.min_cosine();
    let mut least = f64::INFINITY;
    for (i, (w, g)) in want
        .data
        .chunks_exact(dim)
        .zip(got.data.chunks_exact(dim))
        .enumerate()
    {
        let c = cosine(w, g);
        if c.is_nan() || c < min {
            return Err(format!(
                "{}: cosine {c:.6} to the known vector, below {min}",
                row(i)
            ));
        }
        least = least.min(c);
    }
    Ok(least)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

/// Precisions the canary runs at, in order.
pub const PRECISIONS: [Precision; 4] = [
    Precision::F32,
    Precision::Int8,
    Precision::F16,
    Precision::Bf16,
];

/// Precisions a report may leave out: a worker built before the canary
/// answered them. Its verdict says they were not checked.
const ADDED_LATER: [Precision; 2] = [Precision::F16, Precision::Bf16];

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> &'static Reference {
        match reference() {
            Some(r) => r,
            None => panic!("the committed canary answer does not parse"),
        }
    }

    #[test]
    fn the_known_answer_parses_and_covers_every_text_and_precision() {
        let r = known();
        assert_eq!(r.answers.len(), PRECISIONS.len());
        for (a, p) in r.answers.iter().zip(PRECISIONS) {
            assert_eq!(a.precision, p);
            assert_eq!(a.data.len(), TEXTS.len() * a.dim as usize);
            assert!(a.data.iter().all(|v| v.is_finite()));
        }
        // Different texts give different vectors: a constant answer would
        // let a broken kernel through.
        let a = &r.answers[0];
        let d = a.dim as usize;
        assert!(cosine(&a.data[..d], &a.data[d..2 * d]) < 0.99);
        // The speech answer: f32, a row of logits per signal and step, the
        // two signals apart and the steps apart.
        let Some(s) = &r.speech else {
            panic!("the known answer has no speech answer")
        };
        let d = s.dim as usize;
        assert_eq!(s.precision, Precision::F32);
        assert_eq!(s.data.len(), SPEECH_SIGNALS * SPEECH_STEPS * d);
        assert!(s.data.iter().all(|v| v.is_finite()));
        assert!(cosine(&s.data[..d], &s.data[d..2 * d]) < 0.99);
        assert!(cosine(&s.data[..d], &s.data[2 * d..3 * d]) < 0.99);
    }

    #[test]
    fn the_known_answer_passes_and_a_perturbed_or_missing_one_fails() {
        let r = known();
        let speech = r.speech.as_ref();
        let ok = judge(&r.answers, speech).unwrap_or_else(|e| e);
        assert!(ok.contains("12 speech steps agree"), "{ok}");
        let mut bad = r.answers.clone();
        let d = bad[1].dim as usize;
        bad[1].data[3 * d] += 0.25;
        let why = judge(&bad, speech).err().unwrap_or_default();
        assert!(why.contains("at int8: text 3"), "{why}");
        assert!(judge(&r.answers[..1], speech).is_err());
        // The half precisions may be missing (an older worker), and the
        // verdict says so; present and wrong, they fail.
        let old = judge(&r.answers[..2], speech).unwrap_or_else(|e| e);
        assert!(
            old.contains("no f16 or bf16 answer") && old.contains("not checked"),
            "{old}"
        );
        let mut half = r.answers.clone();
        let d = half[3].dim as usize;
        half[3].data[6 * d] += 0.25;
        let why = judge(&half, speech).err().unwrap_or_default();
        assert!(why.contains("at bf16: text 6"), "{why}");
        let mut short = r.answers.clone();
        short[0].data.pop();
        assert!(judge(&short, speech).is_err());
        // A wrong speech row is named; a missing speech answer (an older
        // worker) passes on its embeddings and says so.
        let mut s = speech
            .cloned()
            .unwrap_or_else(|| panic!("no speech answer"));
        let d = s.dim as usize;
        for v in &mut s.data[5 * d..6 * d] {
            *v = -*v;
        }
        let why = judge(&r.answers, Some(&s)).err().unwrap_or_default();
        assert!(why.contains("speech: signal 1, step 2"), "{why}");
        let old = judge(&r.answers, None).unwrap_or_else(|e| e);
        assert!(old.contains("speech not checked"), "{old}");
    }
}
