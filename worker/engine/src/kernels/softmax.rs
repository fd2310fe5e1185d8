//! Attention's softmax with its padding mask added, in one pass per row.
//!
//! candle adds the mask in one op and runs softmax in another with a scalar
//! `exp` per element; padded positions (a large negative score) also take
//! libm's slow underflow path. Here `exp` is a polynomial of mul, add and
//! rounding only, which the compiler vectorises, and rows are split across
//! threads.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::{contiguous_f32, fold8, round_even, sum8};

/// exp(x) to within about 2 units in the last place of f32 for x in
/// [-87.3, 88.7]; clamped there. Below, 0: padding must add nothing.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.3, 88.7);
    let (ni, n) = round_even(x * std::f32::consts::LOG2_E);
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Taylor series of e^r to r^7 on |r| ≤ ln2/2: error below 5e-9.
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // 2^n from its exponent bits; n is in [-126, 128) after the clamp.
    let scale = f32::from_bits((ni + 127).cast_unsigned() << 23);
    if x > -87.3 { p * scale } else { 0.0 }
}

/// The largest value of `v`.
#[inline(always)]
fn max(v: &[f32]) -> f32 {
    fold8(v, f32::NEG_INFINITY, f32::max)
}

/// `v = softmax(v)` for one row.
#[inline(always)]
pub(super) fn softmax_in_place(v: &mut [f32]) {
    let top = max(v);
    for o in v.iter_mut() {
        *o = exp(*o - top);
    }
    let inv = 1.0 / sum8(v);
    for o in v.iter_mut() {
        *o *= inv;
    }
}

/// Softmax over keys for rows side by side: `p` holds key `j`'s score
/// for each of eight rows at `j`, and gets their probabilities. Each row
/// takes [`softmax_in_place`]'s operations in its order (its sum in eight
/// lanes by key, as [`sum8`] adds), so the same bits.
#[inline(always)]
pub(super) fn softmax_lanes(p: &mut [[f32; 8]]) {
    let mut top = [f32::NEG_INFINITY; 8];
    for key in p.iter() {
        for (t, &x) in top.iter_mut().zip(key) {
            *t = t.max(x);
        }
    }
    // `sums[i][r]`: row `r`'s sum of keys `j` with `j % 8 == i`.
    let mut sums = [[0f32; 8]; 8];
    for keys in p.chunks_mut(8) {
        for (sum, key) in sums.iter_mut().zip(keys) {
            for ((s, x), &t) in sum.iter_mut().zip(key.iter_mut()).zip(&top) {
                *x = exp(*x - t);
                *s += *x;
            }
        }
    }
    let [a, b, c, d, e, f, g, h] = sums;
    let inv: [f32; 8] = std::array::from_fn(|r| {
        1.0 / (((a[r] + b[r]) + (c[r] + d[r])) + ((e[r] + f[r]) + (g[r] + h[r])))
    });
    for key in p.iter_mut() {
        for (x, &inv) in key.iter_mut().zip(&inv) {
            *x *= inv;
        }
    }
}

/// `out = softmax(x + mask)` for one row.
#[inline(always)]
fn row(x: &[f32], mask: &[f32], out: &mut [f32]) {
    for ((o, &x), &m) in out.iter_mut().zip(x).zip(mask) {
        *o = x + m;
    }
    softmax_in_place(out);
}

/// What every task reads: the mask, `(batch, k)`, the row length `k`
/// and the rows per batch element.
struct Shared<'a> {
    mask: &'a [f32],
    k: usize,
    rows_per_batch: usize,
}

/// The rows of one task, the first being row `first` of the whole.
#[inline(always)]
fn task(s: &Shared<'_>, x: &[f32], out: &mut [f32], first: usize) {
    let k = s.k;
    for (i, (o, x)) in out.chunks_exact_mut(k).zip(x.chunks_exact(k)).enumerate() {
        let b = (first + i) / s.rows_per_batch;
        row(x, &s.mask[b * k..(b + 1) * k], o);
    }
}

/// [`task`] compiled for x86-64-v3 (AVX2, FMA).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn vectorized(simd: pulp::x86::V3, s: &Shared<'_>, x: &[f32], out: &mut [f32], first: usize) {
    struct Task<'a, 'b> {
        s: &'a Shared<'b>,
        x: &'a [f32],
        out: &'a mut [f32],
        first: usize,
    }
    impl pulp::NullaryFnOnce for Task<'_, '_> {
        type Output = ();
        #[inline(always)]
        fn call(self) {
            task(self.s, self.x, self.out, self.first);
        }
    }
    simd.vectorize(Task { s, x, out, first });
}

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 64;

struct MaskedSoftmax;

impl CustomOp2 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "minions-masked-softmax"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xs_layout: &Layout,
        mask: &CpuStorage,
        mask_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let xs = contiguous_f32("masked-softmax", xs, xs_layout)?;
        let mask = contiguous_f32("masked-softmax", mask, mask_layout)?;
        let (batch, heads, q, k) = xs_layout.shape().dims4()?;
        if mask_layout.dims() != [batch, 1, 1, k] {
            candle_core::bail!(
                "masked-softmax: mask {:?} for scores {:?}",
                mask_layout.dims(),
                xs_layout.dims()
            );
        }
        let mut out = vec![0f32; xs.len()];
        let rows_per_batch = heads * q;
        let shared = Shared {
            mask,
            k,
            rows_per_batch,
        };
        let shared = &shared;
        let run = |(t, (o, x)): (usize, (&mut [f32], &[f32]))| {
            task(shared, x, o, t * ROWS_PER_TASK);
        };
        let tasks = out
            .par_chunks_mut(ROWS_PER_TASK * k)
            .zip(xs.par_chunks(ROWS_PER_TASK * k))
            .enumerate();
        // Compiled for AVX2 and FMA where the CPU has them.
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V3::try_new() {
            tasks.for_each(|(t, (o, x))| vectorized(simd, shared, x, o, t * ROWS_PER_TASK));
            return Ok((CpuStorage::F32(out), xs_layout.shape().clone()));
        }
        tasks.for_each(run);
        Ok((CpuStorage::F32(out), xs_layout.shape().clone()))
    }
}

/// `softmax(scores + mask)` over the last dimension: `scores`
/// `(batch, heads, q, k)`, `mask` `(batch, 1, 1, k)`. One pass on the CPU
/// with our kernels (`host`); candle's ops elsewhere and on the device path.
pub(crate) fn masked_softmax(
    scores: &Tensor,
    mask: &Tensor,
    host: bool,
) -> candle_core::Result<Tensor> {
    if host
        && scores.device().is_cpu()
        && scores.dtype() == candle_core::DType::F32
        && scores.is_contiguous()
        && mask.is_contiguous()
    {
        scores.apply_op2_no_bwd(mask, &MaskedSoftmax)
    } else {
        candle_nn::ops::softmax_last_dim(&scores.broadcast_add(mask)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_across_the_range() {
        let mut worst = 0f64;
        for i in -87_000..=88_000 {
            let x = i as f32 / 1000.0;
            let want = f64::from(x).exp();
            let err = ((f64::from(exp(x)) - want) / want).abs();
            worst = worst.max(err);
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
        assert_eq!(exp(-1e30), 0.0);
    }

    #[test]
    fn matches_candle_softmax_with_the_mask() -> candle_core::Result<()> {
        let dev = candle_core::Device::Cpu;
        let scores = Tensor::randn(0f32, 3.0, (2, 3, 5, 13), &dev)?;
        let mask = Tensor::new(&[[0f32; 13], [0.0; 13]], &dev)?;
        let mask = mask
            .slice_assign(&[1..2, 9..13], &Tensor::full(-1e30f32, (1, 4), &dev)?)?
            .reshape((2, 1, 1, 13))?;
        let ours = masked_softmax(&scores, &mask, true)?;
        let theirs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
        let diff = (&ours - &theirs)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-6, "max diff {diff}");
        let padded = ours
            .narrow(0, 1, 1)?
            .narrow(3, 9, 4)?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(padded < 1e-30, "padding got {padded}");
        Ok(())
    }
}
