//! Choosing the next token of one sequence: greedy, or sampled with its own
//! seeded generator (temperature, top-k, top-p), so that a record's output
//! depends on its own seed only.

use minions_schemas::messages::SamplingParams;

use super::llama::argmax;
use crate::ModelError;

/// How a sampled token is drawn.
struct Draw {
    /// Logits are divided by this (> 0) before the softmax.
    temperature: f32,
    /// Only the `top_k` most likely tokens may be drawn; 0: no limit.
    top_k: usize,
    /// Only the fewest most likely tokens whose probabilities reach
    /// `top_p` may be drawn; 1 or more: no limit.
    top_p: f32,
    /// The record's own generator, seeded with its seed.
    rng: fastrand::Rng,
}

/// One sequence's token chooser.
pub struct Sampler {
    /// `None` when greedy.
    draw: Option<Draw>,
}

impl Sampler {
    /// A chooser for `params`: greedy at temperature 0 (or below), else
    /// sampling seeded with the record's seed.
    pub fn new(params: &SamplingParams) -> Self {
        let t = params.temperature;
        if t <= 0.0 || t.is_nan() {
            return Self { draw: None };
        }
        let p = params.top_p;
        Self {
            draw: Some(Draw {
                temperature: t,
                top_k: params.top_k as usize,
                top_p: if p > 0.0 && p < 1.0 { p } else { 1.0 },
                rng: fastrand::Rng::with_seed(params.seed),
            }),
        }
    }

    /// The next token from one row of logits.
    pub fn next(&mut self, logits: &[f32]) -> Result<u32, ModelError> {
        match &mut self.draw {
            None => Ok(argmax(logits)),
            Some(d) => d.next(logits),
        }
    }
}

impl Draw {
    fn next(&mut self, logits: &[f32]) -> Result<u32, ModelError> {
        // Candidates, cut to top-k; most likely first (ties: the lower id
        // first) where top-k or top-p needs the order, else in id order
        // (no sort of the whole vocabulary per token).
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let by_logit = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let cut = self.top_k > 0 && self.top_k < order.len();
        if cut {
            order.select_nth_unstable_by(self.top_k - 1, by_logit);
            order.truncate(self.top_k);
        }
        if cut || self.top_p < 1.0 {
            order.sort_unstable_by(by_logit);
        }
        if order.is_empty() {
            return Err(ModelError::BadInput("no logits to sample from".into()));
        }
        // Softmax at the temperature over the candidates.
        let top = order
            .iter()
            .map(|&i| logits[i as usize])
            .fold(f32::NEG_INFINITY, f32::max);
        if !top.is_finite() {
            return Err(ModelError::BadInput(format!(
                "the largest logit is {top}: nothing to sample from"
            )));
        }
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| f64::from((logits[i as usize] - top) / self.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        // Top-p: the fewest candidates whose share reaches it.
        let mut kept = weights.len();
        if self.top_p < 1.0 {
            let want = f64::from(self.top_p) * total;
            let mut sum = 0.0;
            for (n, w) in weights.iter().enumerate() {
                sum += w;
                if sum >= want {
                    kept = n + 1;
                    break;
                }
            }
        }
        let kept_total: f64 = weights[..kept].iter().sum();
        let mut at = self.rng.f64() * kept_total;
        for (&w, &id) in weights[..kept].iter().zip(&order) {
            if at < w {
                return Ok(id);
            }
            at -= w;
        }
        // Rounding left a sliver past the last weight.
        Ok(order[kept - 1])
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

    #[test]
    fn top_k_and_top_p_bound_the_draws_and_the_shares_follow_the_softmax() -> Result<(), ModelError>
    {
        // Logits 0, 1, 2, 3, 4 (token 4 the likeliest), then 45 far below.
        let mut logits: Vec<f32> = (0..5).map(|i| i as f32).collect();
        logits.extend(std::iter::repeat_n(-30.0, 45));
        let counts = |top_k: u32, top_p: f32| -> Result<Vec<u32>, ModelError> {
            let mut s = Sampler::new(&SamplingParams {
                top_k,
                top_p,
                ..params(1.0, 3)
            });
            let mut n = vec![0u32; logits.len()];
            for _ in 0..20_000 {
                n[s.next(&logits)? as usize] += 1;
            }
            Ok(n)
        };
        // Top-2: tokens 4 and 3 alone, at e : 1.
        let two = counts(2, 1.0)?;
        assert_eq!(two[3] + two[4], 20_000, "{two:?}");
        let ratio = f64::from(two[4]) / f64::from(two[3]);
        assert!((ratio - std::f64::consts::E).abs() < 0.2, "{ratio}");
        // Top-p 0.5: token 4's share (0.636) reaches it alone.
        assert_eq!(counts(0, 0.5)?[4], 20_000);
        // No limits: every one of the five is drawn; the far ones never.
        let all = counts(0, 1.0)?;
        assert!(all[..5].iter().all(|&n| n > 0), "{all:?}");
        assert_eq!(all[5..].iter().sum::<u32>(), 0);
        Ok(())
    }
}
