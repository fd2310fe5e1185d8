//! Choosing the next token of one sequence: greedy, or sampled with its own
//! seeded generator (temperature, top-k, top-p), so that a record's output
//! depends on its own seed only.

use candle_core::{Device, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use minions_schemas::messages::SamplingParams;

use super::llama::argmax;
use crate::ModelError;

/// One sequence's token chooser.
pub struct Sampler {
    /// `None` when greedy.
    processor: Option<LogitsProcessor>,
}

impl Sampler {
    /// A chooser for `params`: greedy at temperature 0 (or below), else
    /// sampling seeded with the record's seed.
    pub fn new(params: &SamplingParams) -> Self {
        let t = f64::from(params.temperature);
        if t <= 0.0 || t.is_nan() {
            return Self { processor: None };
        }
        let k = params.top_k as usize;
        let p = f64::from(params.top_p);
        let top_p = p > 0.0 && p < 1.0;
        let sampling = match (k > 0, top_p) {
            (false, false) => Sampling::All { temperature: t },
            (true, false) => Sampling::TopK { k, temperature: t },
            (false, true) => Sampling::TopP { p, temperature: t },
            (true, true) => Sampling::TopKThenTopP {
                k,
                p,
                temperature: t,
            },
        };
        Self {
            processor: Some(LogitsProcessor::from_sampling(params.seed, sampling)),
        }
    }

    /// The next token from one row of logits.
    pub fn next(&mut self, logits: &[f32]) -> Result<u32, ModelError> {
        match &mut self.processor {
            None => Ok(argmax(logits)),
            Some(p) => {
                let t = Tensor::from_slice(logits, logits.len(), &Device::Cpu)?;
                Ok(p.sample(&t)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            max_tokens: 4,
            temperature,
            top_p: 0.9,
            top_k: 5,
            seed,
            stop: vec![],
        }
    }

    #[test]
    fn greedy_takes_the_largest_and_seeds_repeat() -> Result<(), ModelError> {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 7) % 13) as f32 * 0.3).collect();
        // The first of the largest: 7 · 11 = 77 ≡ 12 (mod 13).
        assert_eq!(Sampler::new(&params(0.0, 1)).next(&logits)?, 11);
        let draw = |seed| -> Result<Vec<u32>, ModelError> {
            let mut s = Sampler::new(&params(1.0, seed));
            (0..20).map(|_| s.next(&logits)).collect()
        };
        assert_eq!(draw(7)?, draw(7)?);
        assert_ne!(draw(7)?, draw(8)?);
        Ok(())
    }
}
