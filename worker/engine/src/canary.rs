//! The canary shard, run on this machine: the tiny BERT of
//! [`minions_schemas::canary`], its weights from a fixed seed, written as a
//! model folder and loaded through the same path as any model, embeds the
//! canary texts at every precision on the worker's device. The watchdog
//! judges the answers against the known ones.

use std::path::Path;

use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use minions_schemas::canary::{MODEL_SEED, PRECISIONS, TEXTS};
use minions_schemas::messages::CanaryAnswer;

use crate::tiny::{TinySpec, write_bert};
use crate::{Batching, BertEmbedder, EnginePath, ModelError};

/// The canary model's shape: small enough to build and run in milliseconds,
/// wide enough (one int8 block per row) to take every kernel of the family.
const SPEC: TinySpec = TinySpec {
    hidden: 32,
    layers: 2,
    heads: 4,
    max_len: 64,
};

/// Writes the canary model folder into `dir`: the same weights on every
/// machine, whatever its CPU or device.
pub fn write_model(dir: &Path) -> Result<(), ModelError> {
    write_bert(dir, SPEC, fill)
}

/// Runs the canary on `device`, the code `path` names, with the model in
/// `dir` (written by [`write_model`]): one answer per precision, in
/// [`minions_schemas::canary::PRECISIONS`] order.
pub fn run(dir: &Path, device: &Device, path: EnginePath) -> Result<Vec<CanaryAnswer>, ModelError> {
    let texts: Vec<String> = TEXTS.iter().map(|t| (*t).to_owned()).collect();
    PRECISIONS
        .iter()
        .map(|&precision| {
            let m = BertEmbedder::load_with(dir, device, precision, path)?;
            // Two passes, so that a pass with padding is taken as well.
            let data = m.embed(&texts, Batching::texts(TEXTS.len() / 2))?;
            Ok(CanaryAnswer {
                precision,
                dim: u32::try_from(m.dim()).unwrap_or(u32::MAX),
                data,
            })
        })
        .collect()
}

/// Sets every weight from the seed and its name, in name order: layer-norm
/// scales near 1, everything else small and centred on 0.
fn fill(varmap: &VarMap) -> Result<(), ModelError> {
    let vars = varmap
        .data()
        .lock()
        .map_err(|_| ModelError::BadInput("the canary's weights are poisoned".into()))?;
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    for name in names {
        let Some(var) = vars.get(name) else { continue };
        let mut rng = SplitMix(MODEL_SEED ^ fnv1a(name.as_bytes()));
        let (scale, offset) = if name.ends_with("LayerNorm.weight") {
            (0.1, 1.0)
        } else if name.ends_with("bias") {
            (0.02, 0.0)
        } else {
            (0.2, 0.0)
        };
        let values: Vec<f32> = (0..var.elem_count())
            .map(|_| offset + scale * rng.unit())
            .collect();
        var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu)?)?;
    }
    Ok(())
}

/// FNV-1a, 64-bit: a weight's name as a number.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64: a few lines of integer arithmetic, so that every machine
/// draws the same weights.
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), exactly representable.
    pub(crate) fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32) / (1u64 << 23) as f32 - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On both paths: the device path's answer is what a GPU's must be
    /// close to.
    #[test]
    fn the_canary_on_this_cpu_matches_the_known_answer() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        write_model(dir.path())?;
        for path in [EnginePath::Fast, EnginePath::Device] {
            let answers = run(dir.path(), &Device::Cpu, path)?;
            let speech = crate::speech::canary::run(&Device::Cpu, path)?;
            let verdict = minions_schemas::canary::judge(&answers, Some(&speech));
            assert!(verdict.is_ok(), "{path} path: {verdict:?}");
        }
        Ok(())
    }

    #[test]
    fn draws_are_uniform_on_minus_one_to_one() {
        let mut r = SplitMix(7);
        let v: Vec<f32> = (0..10_000).map(|_| r.unit()).collect();
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.05, "{mean}");
    }
}
