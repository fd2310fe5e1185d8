//! Layer norm over the last dimension, in place, row by row.
//!
//! candle's CPU layer norm sums each row one element at a time (a chain
//! the compiler cannot reorder), takes the variance as E[x²] − mean², and
//! hands out one row per parallel task. Here the sums run eight lanes at a
//! time, the variance is taken from the deviations (a second pass over a
//! row already in cache), rows go to tasks in groups, and the int8 kernel
//! applies the same function to its output rows while they are in cache.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::lanes::{Lanes, Plain};
use super::{contiguous_f32, sum8, sum8_by};

/// The op's name in errors.
const OP: &str = "layer norm";
/// Rows per parallel task.
const ROWS_PER_TASK: usize = 32;

/// A layer norm's weights: `(x − mean) / √(var + eps) · gamma + beta`.
pub(crate) struct NormParams {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl NormParams {
    /// `gamma` and `beta` as long as the rows they apply to.
    pub(crate) fn new(gamma: Vec<f32>, beta: Vec<f32>, eps: f32) -> candle_core::Result<Self> {
        if gamma.len() != beta.len() || gamma.is_empty() {
            candle_core::bail!(
                "{OP}: weight of {} and bias of {} values",
                gamma.len(),
                beta.len()
            );
        }
        Ok(Self { gamma, beta, eps })
    }

    /// The row length these weights apply to.
    pub(crate) fn len(&self) -> usize {
        self.gamma.len()
    }
}

/// Normalises one row in place; `row` is as long as the weights.
#[inline(always)]
pub(super) fn normalise(row: &mut [f32], p: &NormParams) {
    let n = row.len() as f32;
    let mean = sum8(row) / n;
    for x in row.iter_mut() {
        *x -= mean;
    }
    let var = sum8_by(row, |x| x * x) / n;
    let inv = 1.0 / (var + p.eps).sqrt();
    for ((x, &g), &b) in row.iter_mut().zip(&p.gamma).zip(&p.beta) {
        *x = *x * inv * g + b;
    }
}

/// Normalises every row of `rows` in place, compiled for `S`.
fn task<S: Lanes>(s: S, rows: &mut [f32], p: &NormParams) {
    struct Task<'a, 'b> {
        rows: &'a mut [f32],
        p: &'b NormParams,
    }
    impl pulp::NullaryFnOnce for Task<'_, '_> {
        type Output = ();
        #[inline(always)]
        fn call(self) {
            for row in self.rows.chunks_exact_mut(self.p.len()) {
                normalise(row, self.p);
            }
        }
    }
    s.run(Task { rows, p });
}

struct LayerNorm<'a>(&'a NormParams);

impl CustomOp1 for LayerNorm<'_> {
    fn name(&self) -> &'static str {
        "minions-layer-norm"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(OP, s, l)?;
        let n = self.0.len();
        if l.dims().last() != Some(&n) {
            candle_core::bail!("{OP}: input {:?}, weights of {n}", l.dims());
        }
        let mut out = x.to_vec();
        let chunks = out.par_chunks_mut(ROWS_PER_TASK * n);
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V3::try_new() {
            chunks.for_each(|rows| task(simd, rows, self.0));
            return Ok((CpuStorage::F32(out), l.shape().clone()));
        }
        chunks.for_each(|rows| task(Plain, rows, self.0));
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }
}

/// Layer norm of `x` (f32, on the CPU) over its last dimension.
pub(crate) fn layer_norm(x: &Tensor, p: &NormParams) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&LayerNorm(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn matches_candle_layer_norm() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let (rows, n) = (70, 37);
        let x = Tensor::randn(0f32, 1.0, (rows, n), &dev)?.affine(3.0, 0.5)?;
        let g = Tensor::randn(1f32, 0.1, n, &dev)?;
        let b = Tensor::randn(0f32, 0.1, n, &dev)?;
        let p = NormParams::new(g.to_vec1()?, b.to_vec1()?, 1e-12)?;
        let ours = layer_norm(&x, &p)?;
        let theirs = candle_nn::ops::layer_norm(&x, &g, &b, 1e-12)?;
        let diff = (ours - theirs)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-5, "max diff {diff}");
        Ok(())
    }

    #[test]
    fn refuses_rows_of_another_length() -> candle_core::Result<()> {
        let x = Tensor::zeros((3, 5), candle_core::DType::F32, &Device::Cpu)?;
        let p = NormParams::new(vec![1.0; 4], vec![0.0; 4], 1e-5)?;
        let err = layer_norm(&x, &p).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("weights of 4")));
        Ok(())
    }
}
