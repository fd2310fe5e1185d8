//! A fault switch for tests of result checking: a worker started with
//! `MINIONS_TEST_PERTURB=N` perturbs the output of one shard in `N` (every
//! shard with `1`), as failing memory, a bad driver or a wrong build would.
//! Off unless a test sets it; a worker that has it on says so loudly at
//! start. Which shards are perturbed follows from the job and shard alone,
//! so every delivery of a shard to this worker is perturbed alike.

use minions_schemas::messages::OutputPayload;
use sha2::{Digest, Sha256};

/// The environment variable that turns the switch on.
pub const PERTURB_VAR: &str = "MINIONS_TEST_PERTURB";

/// The switch as this process reads it: perturb one shard in `N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Perturb {
    one_in: u64,
}

impl Perturb {
    /// The switch from the environment; `None` when off (unset, `0`, or not
    /// a number: a value that is not understood leaves outputs alone).
    pub(crate) fn from_env() -> Option<Self> {
        let v = std::env::var(PERTURB_VAR).ok()?;
        match v.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(one_in) => Some(Self { one_in }),
            Err(_) => {
                tracing::warn!(variable = PERTURB_VAR, value = %v,
                    "not a number: the fault switch stays off");
                None
            }
        }
    }

    /// Whether this worker perturbs `shard` of `job`.
    pub(crate) fn hits(self, job: &str, shard: u32) -> bool {
        let h = Sha256::new()
            .chain_update(job.as_bytes())
            .chain_update(shard.to_le_bytes())
            .finalize();
        let mut n = [0u8; 8];
        n.copy_from_slice(&h[..8]);
        u64::from_le_bytes(n) % self.one_in == 0
    }

    /// Perturbs `payload` in place: every embedding's first component
    /// shifts by 0.25 (a cosine near 0.97 to the true vector), every
    /// generation's and transcript's text gains a word.
    pub(crate) fn apply(payload: &mut OutputPayload) {
        match payload {
            OutputPayload::Embeddings { dim, data } => {
                let stride = (*dim as usize) * 4;
                if stride == 0 {
                    return;
                }
                for row in data.chunks_exact_mut(stride) {
                    let mut x = [0u8; 4];
                    x.copy_from_slice(&row[..4]);
                    let v = f32::from_le_bytes(x) + 0.25;
                    row[..4].copy_from_slice(&v.to_le_bytes());
                }
            }
            OutputPayload::Generations { records } => {
                for g in records {
                    g.text.push_str(" perturbed");
                }
            }
            OutputPayload::Transcripts { records } => {
                for t in records {
                    t.text.push_str(" perturbed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_in_n_shards_is_hit_and_always_the_same_ones() {
        let p = Perturb { one_in: 50 };
        let hits: Vec<u32> = (0..5000).filter(|&s| p.hits("job", s)).collect();
        assert!((60..=140).contains(&hits.len()), "{}", hits.len());
        let again: Vec<u32> = (0..5000).filter(|&s| p.hits("job", s)).collect();
        assert_eq!(hits, again);
        assert!((0..100).all(|s| Perturb { one_in: 1 }.hits("job", s)));
    }

    #[test]
    fn perturbed_embeddings_differ_in_every_row() {
        let rows: Vec<f32> = vec![0.6, 0.8, 0.0, 1.0];
        let data: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut p = OutputPayload::Embeddings { dim: 2, data };
        Perturb::apply(&mut p);
        let OutputPayload::Embeddings { data, .. } = p else {
            panic!("still embeddings");
        };
        let got: Vec<f32> = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, vec![0.85, 0.8, 0.25, 1.0]);
    }
}
