//! The canary: a small known shard every worker runs when it starts (so on
//! every new build, device or kernel path) before it pulls any work, and
//! whose answer the watchdogs know. A worker whose kernels give wrong
//! answers is refused before it touches a real shard.
//!
//! The shard is [`TEXTS`] embedded by a tiny BERT whose weights follow from
//! a fixed seed (the worker's engine builds it and loads it through the
//! same path as any model), at every precision. The known answer,
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

/// The committed known answer, as `make_canary_reference` writes it.
#[derive(Debug, Deserialize)]
pub struct Reference {
    /// What made it (the portable CPU path).
    pub made_by: String,
    /// One answer per precision.
    pub answers: Vec<CanaryAnswer>,
}

const REFERENCE_JSON: &str = include_str!("../fixtures/canary.json");

/// The known answer, parsed once. `None` only if the committed fixture does
/// not parse, which a unit test rules out.
pub fn reference() -> Option<&'static Reference> {
    static REF: OnceLock<Option<Reference>> = OnceLock::new();
    REF.get_or_init(|| serde_json::from_str(REFERENCE_JSON).ok())
        .as_ref()
}

/// Judges `answers` against the known answer: `Ok` with how close they
/// came, or `Err` naming the first precision and text that is wrong. Every
/// precision of the known answer must be answered.
pub fn judge(answers: &[CanaryAnswer]) -> Result<String, String> {
    let Some(known) = reference() else {
        return Err("this build's known canary answer does not parse".into());
    };
    let mut least = Vec::new();
    for want in &known.answers {
        let p = want.precision;
        let Some(got) = answers.iter().find(|a| a.precision == p) else {
            return Err(format!("no answer at {p}"));
        };
        let c = least_cosine(want, got).map_err(|why| format!("at {p}: {why}"))?;
        least.push(format!("{p} {c:.6}"));
    }
    Ok(format!(
        "{} texts agree with the known answer (least cosine: {})",
        TEXTS.len(),
        least.join(", ")
    ))
}

/// The least cosine between the rows of `want` and `got`, or why they
/// cannot match.
fn least_cosine(want: &CanaryAnswer, got: &CanaryAnswer) -> Result<f64, String> {
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
                "text {i} ({:?}): cosine {c:.6} to the known vector, below {min}",
                TEXTS.get(i).copied().unwrap_or("?")
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
pub const PRECISIONS: [Precision; 2] = [Precision::F32, Precision::Int8];

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
    }

    #[test]
    fn the_known_answer_passes_and_a_perturbed_or_missing_one_fails() {
        let r = known();
        assert!(judge(&r.answers).is_ok());
        let mut bad = r.answers.clone();
        let d = bad[1].dim as usize;
        bad[1].data[3 * d] += 0.25;
        let why = judge(&bad).err().unwrap_or_default();
        assert!(why.contains("at int8: text 3"), "{why}");
        assert!(judge(&r.answers[..1]).is_err());
        let mut short = r.answers.clone();
        short[0].data.pop();
        assert!(judge(&short).is_err());
    }
}
