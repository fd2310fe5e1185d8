//! GELU (the exact, erf form BERT uses) with the bias add of the layer
//! before it, in one pass.
//!
//! candle's `gelu_erf` calls a scalar `erf` per element; here `erf` is a
//! rational approximation of mul, add, div, min and max only, which the
//! compiler turns into SIMD code, and rows are split across threads.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::contiguous_f32;

/// Numerator coefficients (odd powers 1, 3, ..., 13) and denominator
/// coefficients (even powers 0, 2, ..., 8) of a rational approximation of
/// erf on [-4, 4], as published in Eigen's `generic_fast_erf_float`
/// (MathFunctionsImpl.h). Outside [-4, 4], erf is ±1 in f32.
const NUM: [f32; 7] = [
    -1.609_603_3e-2,
    -2.954_6e-3,
    -7.349_906e-4,
    -5.692_506_4e-5,
    -2.101_024e-6,
    2.770_681_4e-8,
    -2.726_142_3e-10,
];
const DEN: [f32; 5] = [
    -1.426_473_9e-2,
    -7.373_329e-3,
    -1.682_827e-3,
    -2.133_740_6e-4,
    -1.456_607_2e-5,
];

/// erf(x) to within a few units in the last place of f32.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = NUM[6];
    for c in NUM[..6].iter().rev() {
        p = p * x2 + c;
    }
    let mut q = DEN[4];
    for c in DEN[..4].iter().rev() {
        q = q * x2 + c;
    }
    x * p / q
}

/// GELU(x) = x/2 · (1 + erf(x/√2)).
#[inline(always)]
pub(super) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `dst[i] = gelu(src[i] + bias[i % bias.len()])` for whole rows.
fn rows(src: &[f32], bias: &[f32], dst: &mut [f32]) {
    for (s, d) in src
        .chunks_exact(bias.len())
        .zip(dst.chunks_exact_mut(bias.len()))
    {
        for ((d, &x), &b) in d.iter_mut().zip(s).zip(bias) {
            *d = gelu(x + b);
        }
    }
}

/// Rows per parallel task: enough work to outweigh handing it out.
const ROWS_PER_TASK: usize = 16;

struct BiasGelu;

impl CustomOp2 for BiasGelu {
    fn name(&self) -> &'static str {
        "minions-bias-gelu"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xs_layout: &Layout,
        bias: &CpuStorage,
        bias_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let xs = contiguous_f32("bias-gelu", xs, xs_layout)?;
        let bias = contiguous_f32("bias-gelu", bias, bias_layout)?;
        let width = bias.len();
        if width == 0 || xs_layout.dims().last() != Some(&width) {
            candle_core::bail!(
                "bias-gelu: bias of {width} for rows of {:?}",
                xs_layout.dims()
            );
        }
        let mut out = vec![0f32; xs.len()];
        let chunk = width * ROWS_PER_TASK;
        out.par_chunks_mut(chunk)
            .zip(xs.par_chunks(chunk))
            .for_each(|(d, s)| rows(s, bias, d));
        Ok((CpuStorage::F32(out), xs_layout.shape().clone()))
    }
}

/// `gelu(xs + bias)`, `bias` broadcast over the rows of `xs` (its last
/// dimension). One fused pass on the CPU with our kernels (`host`);
/// candle's ops elsewhere and on the device path.
pub(crate) fn bias_gelu(xs: &Tensor, bias: &Tensor, host: bool) -> candle_core::Result<Tensor> {
    if host && xs.device().is_cpu() && xs.dtype() == candle_core::DType::F32 && xs.is_contiguous() {
        xs.apply_op2_no_bwd(bias, &BiasGelu)
    } else {
        xs.broadcast_add(bias)?.gelu_erf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf in f64 by its Taylor series (|x| ≤ 3) or continued fraction
    /// (beyond): a reference independent of the approximation under test.
    fn erf_ref(x: f64) -> f64 {
        if x.abs() > 3.0 {
            // erfc(x) = exp(-x²)/(x√π) · 1/(1 + 1/(2x²)/(1 + 2/(2x²)/(1 + ...)))
            let a = x.abs();
            let mut f = 0.0;
            for n in (1..60).rev() {
                f = (n as f64 / 2.0) / (a + f);
            }
            let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f);
            return (1.0 - erfc).copysign(x);
        }
        let mut sum = 0.0;
        let mut term = x;
        for n in 0..200 {
            sum += term / (2 * n + 1) as f64;
            term *= -x * x / (n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn erf_is_accurate_across_the_range() {
        let mut worst = 0f64;
        for i in -80_000..=80_000 {
            let x = i as f64 / 10_000.0;
            let err = (f64::from(erf(x as f32)) - erf_ref(x)).abs();
            worst = worst.max(err);
        }
        assert!(worst < 5e-7, "worst abs error {worst:e}");
    }

    #[test]
    fn fused_op_matches_candle_gelu_erf() -> candle_core::Result<()> {
        let dev = candle_core::Device::Cpu;
        let xs = Tensor::arange(-2000f32, 2000f32, &dev)?
            .affine(0.004, 0.0)?
            .reshape((40, 100))?;
        let bias = Tensor::arange(0f32, 100f32, &dev)?.affine(0.01, -0.5)?;
        let ours = bias_gelu(&xs, &bias, true)?;
        let theirs = xs.broadcast_add(&bias)?.gelu_erf()?;
        let diff = (ours - theirs)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-6, "max diff {diff}");
        Ok(())
    }
}
