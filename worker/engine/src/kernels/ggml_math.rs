//! llama.cpp's CPU arithmetic outside the matrix products, reproduced bit
//! for bit as its x86-64-v3 build (AVX2, FMA) computes it: the vector
//! `exp` (a polynomial from Arm's optimized-routines, evaluated with fused
//! multiply-adds), SiLU times the gate built on it, softmax weights summed
//! in f64 eight lanes at a time, and RMS norm with its sum of squares in
//! f64.
//!
//! Close is not enough for agreement with llama.cpp's logits: activations
//! are quantized to 8 bits before every product and keys, values and
//! attention weights rounded to f16, so a last-bit difference that flips
//! one rounding moves a value by a whole step, and thirty layers later a
//! near tie can go the other way. With the same bits everywhere the same
//! tokens come out.
//!
//! On x86-64-v3 the lanes are AVX2 registers; elsewhere each lane is
//! computed alone with `f32::mul_add`, which rounds exactly as the fused
//! instruction does, so both paths give the same bits.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::{CpuPath, contiguous_f32, hsum8};

/// 1.5 · 2^23: adding it rounds to an integer in the low mantissa bits.
const SHIFT: f32 = f32::from_bits(0x4b40_0000);
/// log2(e), rounded to f32.
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
/// ln 2 split in two: a high part with trailing zero bits, and the rest.
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// The polynomial's coefficients, highest degree first.
const P0: f32 = f32::from_bits(0x3c07_2010);
const P1: f32 = f32::from_bits(0x3d2b_9f17);
const P2: f32 = f32::from_bits(0x3e2a_af33);
const P3: f32 = f32::from_bits(0x3eff_fedb);
const P4: f32 = f32::from_bits(0x3f7f_fff6);

/// Rows per parallel task in the row-wise ops.
const ROWS_PER_TASK: usize = 8;

/// One lane of ggml's vector `exp`: `2^n · (1 + p(b))` with `n` the
/// nearest integer to `x · log2(e)` and `b` the remainder in the natural
/// base; scaled in two steps where `2^n` alone would overflow or vanish.
#[inline(always)]
fn exp_lane(x: f32) -> f32 {
    let z = x.mul_add(LOG2E, SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = P0
        .mul_add(b, P1)
        .mul_add(u, P2.mul_add(b, P3))
        .mul_add(u, P4 * b);
    // A NaN takes the common path, as the vector compare (ordered, quiet)
    // sends it.
    if n.abs() <= 126.0 || n.is_nan() {
        return k.mul_add(j, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    if n.abs() > 192.0 {
        return s1 * s1;
    }
    let s2 = f32::from_bits(e.wrapping_sub(g));
    s2.mul_add(j, s2) * s1
}

/// SiLU of one lane times its gate, as the vector path computes it.
#[inline(always)]
fn silu_gate_lane(x: f32, g: f32) -> f32 {
    x / (1.0 + exp_lane(0.0 - x)) * g
}

/// Which instructions run the element-wise arithmetic; picked once per
/// call from what the CPU has.
#[derive(Clone, Copy)]
pub(crate) enum Math {
    /// AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    V3(pulp::x86::V3),
    /// One lane at a time.
    Plain,
}

impl Math {
    /// What the kernels' [`CpuPath`] allows on this CPU.
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if CpuPath::get() >= CpuPath::Avx2
            && let Some(v3) = pulp::x86::V3::try_new()
        {
            return Self::V3(v3);
        }
        Self::Plain
    }

    /// Replaces every `v[i]` by `exp(v[i] − max)` and returns their sum,
    /// as `ggml_vec_soft_max_f32` computes it over a row padded to a
    /// multiple of eight with masked (zero-weight) entries: each group of
    /// eight summed in f32 in `hsum8`'s order, the groups in f64.
    pub(crate) fn exp_sum(self, v: &mut [f32], max: f32) -> f64 {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::V3(v3) => v3.vectorize(
                #[inline(always)]
                || {
                    exp_sum_with(
                        v,
                        max,
                        #[inline(always)]
                        |x| simd::exp8(v3, x),
                    )
                },
            ),
            Self::Plain => exp_sum_with(v, max, |x| x.map(exp_lane)),
        }
    }

    /// `out = silu(gate) · up`, element by element, as
    /// `ggml_vec_swiglu_f32` computes it.
    fn swiglu_rows(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::V3(v3) => v3.vectorize(
                #[inline(always)]
                || {
                    swiglu_with(
                        gate,
                        up,
                        out,
                        #[inline(always)]
                        |x, g| simd::silu_gate8(v3, x, g),
                    )
                },
            ),
            Self::Plain => swiglu_with(gate, up, out, |x, g| {
                std::array::from_fn(|l| silu_gate_lane(x[l], g[l]))
            }),
        }
    }
}

/// [`Math::exp_sum`] over eight-lane `exp8`; the last group is padded with
/// lanes whose result is then dropped.
#[inline(always)]
fn exp_sum_with(v: &mut [f32], max: f32, exp8: impl Fn([f32; 8]) -> [f32; 8]) -> f64 {
    let mut sum = 0f64;
    for c in v.chunks_mut(8) {
        let mut x = [0f32; 8];
        for (x, &v) in x.iter_mut().zip(c.iter()) {
            *x = v - max;
        }
        let mut e = exp8(x);
        e[c.len()..].fill(0.0);
        c.copy_from_slice(&e[..c.len()]);
        sum += f64::from(hsum8(e));
    }
    sum
}

/// [`Math::swiglu_rows`] over an eight-lane kernel; the tail, if any, one
/// element at a time with libm's `expf`, as ggml's scalar loop does.
#[inline(always)]
fn swiglu_with(
    gate: &[f32],
    up: &[f32],
    out: &mut [f32],
    f8: impl Fn([f32; 8], [f32; 8]) -> [f32; 8],
) {
    let n = out.len() - out.len() % 8;
    for ((o, x), g) in out[..n]
        .chunks_exact_mut(8)
        .zip(gate[..n].chunks_exact(8))
        .zip(up[..n].chunks_exact(8))
    {
        let mut xa = [0f32; 8];
        let mut ga = [0f32; 8];
        xa.copy_from_slice(x);
        ga.copy_from_slice(g);
        o.copy_from_slice(&f8(xa, ga));
    }
    for i in n..out.len() {
        let x = gate[i];
        out[i] = x / (1.0 + (-x).exp()) * up[i];
    }
}

/// The AVX2 lanes.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{LN2_HI, LN2_LO, LOG2E, P0, P1, P2, P3, P4, SHIFT, exp_lane};
    use pulp::bytemuck::cast;
    use pulp::x86::V3;
    use std::arch::x86_64::{__m256, __m256i, _CMP_GT_OQ};

    /// All lanes `c`.
    #[inline(always)]
    fn s(v3: V3, c: f32) -> __m256 {
        v3.avx._mm256_set1_ps(c)
    }

    /// `a · b + c`, fused.
    #[inline(always)]
    fn fmadd(v3: V3, a: __m256, b: __m256, c: __m256) -> __m256 {
        v3.fma._mm256_fmadd_ps(a, b, c)
    }

    /// ggml's vector `exp` of eight lanes. Lanes beyond the common range
    /// (rare: |x| above about 87) are recomputed one at a time, which
    /// gives the bits the vector's own special case gives.
    #[inline(always)]
    pub(super) fn exp8(v3: V3, x: [f32; 8]) -> [f32; 8] {
        let xv: __m256 = cast(x);
        let z = fmadd(v3, xv, s(v3, LOG2E), s(v3, SHIFT));
        let n = v3.avx._mm256_sub_ps(z, s(v3, SHIFT));
        let b = v3.fma._mm256_fnmadd_ps(
            n,
            s(v3, LN2_LO),
            v3.fma._mm256_fnmadd_ps(n, s(v3, LN2_HI), xv),
        );
        let e = v3.avx2._mm256_slli_epi32::<23>(cast(z));
        let one: __m256i = cast(s(v3, 1.0));
        let k: __m256 = cast(v3.avx2._mm256_add_epi32(e, one));
        let abs_n = v3.avx._mm256_andnot_ps(s(v3, -0.0), n);
        let c = v3.avx._mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, s(v3, 126.0));
        if v3.avx._mm256_movemask_ps(c) != 0 {
            return x.map(exp_lane);
        }
        let u = v3.avx._mm256_mul_ps(b, b);
        let j = fmadd(
            v3,
            fmadd(
                v3,
                fmadd(v3, s(v3, P0), b, s(v3, P1)),
                u,
                fmadd(v3, s(v3, P2), b, s(v3, P3)),
            ),
            u,
            v3.avx._mm256_mul_ps(s(v3, P4), b),
        );
        cast(fmadd(v3, j, k, k))
    }

    /// `x / (1 + exp(−x)) · g` over eight lanes.
    #[inline(always)]
    pub(super) fn silu_gate8(v3: V3, x: [f32; 8], g: [f32; 8]) -> [f32; 8] {
        let xv: __m256 = cast(x);
        let neg = v3.avx._mm256_sub_ps(v3.avx._mm256_setzero_ps(), xv);
        let e: __m256 = cast(exp8(v3, cast(neg)));
        let d = v3.avx._mm256_add_ps(v3.avx._mm256_set1_ps(1.0), e);
        let y = v3.avx._mm256_div_ps(xv, d);
        cast(v3.avx._mm256_mul_ps(y, cast(g)))
    }
}

/// An RMS norm's weights, kept on the host for the CPU path.
pub(crate) struct RmsWeight {
    w: Vec<f32>,
    eps: f32,
}

impl RmsWeight {
    /// `w` as long as the rows it applies to; `eps` as the file says.
    pub(crate) fn new(w: Vec<f32>, eps: f32) -> Self {
        Self { w, eps }
    }
}

/// One row of `ggml_compute_forward_rms_norm_f32` followed by the weight
/// product: squares summed in f64 in order, `scale = 1 / √(mean + eps)`
/// in f32, then `x · scale · w`.
#[inline(always)]
fn rms_row(x: &[f32], p: &RmsWeight, out: &mut [f32]) {
    let mut sum = 0f64;
    for &v in x {
        sum += f64::from(v * v);
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + p.eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(&p.w) {
        *o = v * scale * w;
    }
}

struct RmsNorm<'a>(&'a RmsWeight);

impl CustomOp1 for RmsNorm<'_> {
    fn name(&self) -> &'static str {
        "minions-ggml-rms-norm"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32("rms norm", s, l)?;
        let n = self.0.w.len();
        if n == 0 || l.dims().last() != Some(&n) {
            candle_core::bail!("rms norm: input {:?}, weights of {n}", l.dims());
        }
        let mut out = vec![0f32; x.len()];
        let task = n * ROWS_PER_TASK;
        if x.len() <= task {
            for (o, x) in out.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
                rms_row(x, self.0, o);
            }
        } else {
            out.par_chunks_mut(task)
                .zip(x.par_chunks(task))
                .for_each(|(o, x)| {
                    for (o, x) in o.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
                        rms_row(x, self.0, o);
                    }
                });
        }
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }
}

/// RMS norm of `x` (f32 on the CPU) over its last dimension, times the
/// weights, bit for bit as llama.cpp's CPU path.
pub(crate) fn rms_norm(x: &Tensor, p: &RmsWeight) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&RmsNorm(p))
}

struct Swiglu;

impl CustomOp2 for Swiglu {
    fn name(&self) -> &'static str {
        "minions-ggml-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let gate = contiguous_f32("swiglu", s1, l1)?;
        let up = contiguous_f32("swiglu", s2, l2)?;
        if l1.dims() != l2.dims() {
            candle_core::bail!("swiglu: gate {:?}, up {:?}", l1.dims(), l2.dims());
        }
        let n = l1.dims().last().copied().unwrap_or(1).max(1);
        let math = Math::detect();
        let mut out = vec![0f32; gate.len()];
        let task = n * ROWS_PER_TASK;
        if gate.len() <= task {
            for ((o, g), u) in out.chunks_mut(n).zip(gate.chunks(n)).zip(up.chunks(n)) {
                math.swiglu_rows(g, u, o);
            }
        } else {
            out.par_chunks_mut(task)
                .zip(gate.par_chunks(task))
                .zip(up.par_chunks(task))
                .for_each(|((o, g), u)| {
                    for ((o, g), u) in o.chunks_mut(n).zip(g.chunks(n)).zip(u.chunks(n)) {
                        math.swiglu_rows(g, u, o);
                    }
                });
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// `silu(gate) · up` (f32 on the CPU, the same shape), bit for bit as
/// llama.cpp's CPU path.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    gate.contiguous()?
        .apply_op2_no_bwd(&up.contiguous()?, &Swiglu)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs across the whole range, special cases included.
    fn samples() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            88.0,
            88.5,
            89.0,
            -87.0,
            -88.0,
            -100.0,
            -104.0,
            -150.0,
            f32::NEG_INFINITY,
            f32::INFINITY,
            1e-30,
            -1e-30,
        ];
        let mut x = -120.0f32;
        while x < 100.0 {
            v.push(x);
            x += 0.013_7;
        }
        v
    }

    #[test]
    fn exp_is_close_to_libm_and_saturates() {
        for x in samples() {
            let ours = exp_lane(x);
            let want = f64::from(x).exp();
            if x >= 89.0 {
                assert_eq!(ours, f32::INFINITY, "{x}");
            } else if x <= -105.0 {
                assert_eq!(ours, 0.0, "{x}");
            } else if (-87.0..=88.0).contains(&x) {
                let err = ((f64::from(ours) - want) / want).abs();
                assert!(err < 3e-7, "exp({x}) = {ours}, want {want}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_lanes_equal_the_portable_lanes() {
        let Some(v3) = pulp::x86::V3::try_new() else {
            return;
        };
        let xs = samples();
        for c in xs.chunks(8) {
            let mut x = [0f32; 8];
            x[..c.len()].copy_from_slice(c);
            let v = v3.vectorize(|| simd::exp8(v3, x));
            for (a, b) in v.iter().zip(x.map(exp_lane)) {
                assert_eq!(a.to_bits(), b.to_bits(), "{x:?}");
            }
            let g = x.map(|v| 0.5 - v / 7.0);
            let s = v3.vectorize(|| simd::silu_gate8(v3, x, g));
            for l in 0..8 {
                let want = silu_gate_lane(x[l], g[l]);
                assert!(
                    s[l].to_bits() == want.to_bits() || (s[l].is_nan() && want.is_nan()),
                    "{} {} {want}",
                    x[l],
                    s[l]
                );
            }
        }
    }

    #[test]
    fn exp_sum_pads_with_zero_weight_and_sums_by_groups() {
        let mut v: Vec<f32> = (0..13).map(|i| i as f32 * 0.25 - 2.0).collect();
        let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let orig = v.clone();
        let sum = Math::detect().exp_sum(&mut v, max);
        let mut plain = orig.clone();
        assert_eq!(Math::Plain.exp_sum(&mut plain, max), sum);
        assert_eq!(plain, v);
        let want: f64 = orig.iter().map(|&x| f64::from(x - max).exp()).sum();
        assert!((sum - want).abs() / want < 1e-6, "{sum} {want}");
    }

    #[test]
    fn rms_norm_and_swiglu_match_plain_arithmetic() -> candle_core::Result<()> {
        let dev = candle_core::Device::Cpu;
        let (rows, n) = (20, 24);
        let x = Tensor::randn(0f32, 1.0, (rows, n), &dev)?;
        let w: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 / 10.0).collect();
        let ours = rms_norm(&x, &RmsWeight::new(w.clone(), 1e-5))?;
        let wt = Tensor::new(w, &dev)?;
        let theirs = candle_nn::ops::rms_norm(&x, &wt, 1e-5)?;
        let diff = (ours - theirs)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-5, "rms norm diff {diff}");
        let g = Tensor::randn(0f32, 3.0, (rows, n + 3), &dev)?;
        let u = Tensor::randn(0f32, 1.0, (rows, n + 3), &dev)?;
        let ours = swiglu(&g, &u)?;
        let theirs = (candle_nn::ops::silu(&g)? * &u)?;
        let diff = (ours - theirs)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-5, "swiglu diff {diff}");
        Ok(())
    }
}
