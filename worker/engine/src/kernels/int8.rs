//! int8 matrix product for linear layers on x86-64 CPUs with AVX2.
//!
//! candle's quantized matmul (ggml's Q8_0) is slower than its f32 product
//! on CPUs without AVX-512 VNNI: it converts and sums 32-wide blocks one
//! dot product at a time. This kernel is a tiled product instead:
//! - weights are quantised once, at load, to [-127, 127] with one scale per
//!   output column, and packed into panels of 16 columns whose values for
//!   two consecutive inputs sit side by side (what `vpmaddwd` multiplies);
//! - activations are quantised per row (token) with one scale each, inside
//!   the task that uses them;
//! - a micro-tile of up to 6 rows × 16 columns keeps its 32-bit sums in 12
//!   registers for the whole inner dimension; sums of products of values in
//!   [-127, 127] cannot overflow `i32` for inner sizes below 130,000;
//! - the epilogue scales back to f32 and adds the bias, then optionally
//!   applies GELU and adds a residual, in the same pass.
//!
//! It runs where the CPU has AVX2 ([`available`]); callers use candle's
//! quantized matmul elsewhere.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::gelu::gelu;
use super::layer_norm::{NormParams, normalise};
use super::{contiguous_f32, fold8, round_even};

/// The op's name in errors.
const OP: &str = "int8 linear";

/// Columns per packed panel (two 8-lane registers).
const NR: usize = 16;
/// Rows per micro-tile.
const MR: usize = 6;
/// Rows per parallel task.
const ROWS_PER_TASK: usize = 8 * MR;
/// Largest quantised magnitude.
const QMAX: f32 = 127.0;

/// Whether this CPU runs the kernel.
pub(crate) fn available() -> bool {
    simd::Simd::try_new().is_some()
}

/// A linear layer's weight, quantised and packed for [`linear`].
pub(crate) struct Int8Weight {
    /// Inner (input) size.
    k: usize,
    /// Output size.
    n: usize,
    /// Input pairs per column: `k` rounded up to even, halved.
    pairs: usize,
    /// Panel `p`, pair `i` at `p * pairs + i`: for each of the panel's 16
    /// columns, its two quantised values for inputs `2i` and `2i + 1`.
    panels: Vec<[[i16; NR]; 2]>,
    /// One scale per output column, padded with zeros to whole panels.
    scale: Vec<f32>,
    /// The layer's bias, padded with zeros to whole panels.
    bias: Vec<f32>,
}

impl Int8Weight {
    /// Quantises `w` (`(out, in)`, as checkpoints store it, f32) and keeps
    /// `b` (`out`) beside it.
    pub(crate) fn new(w: &Tensor, b: &Tensor) -> candle_core::Result<Self> {
        let (n, k) = w.dims2()?;
        let w: Vec<Vec<f32>> = w.to_vec2()?;
        let mut bias: Vec<f32> = b.to_vec1()?;
        if bias.len() != n {
            candle_core::bail!("int8 linear: bias of {} for {n} outputs", bias.len());
        }
        let pairs = k.div_ceil(2);
        let n_panels = n.div_ceil(NR);
        bias.resize(n_panels * NR, 0.0);
        let mut scale = vec![0f32; n_panels * NR];
        let mut q = vec![0i16; n_panels * NR * pairs * 2];
        for (col, row) in w.iter().enumerate() {
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let s = amax / QMAX;
            let inv = if amax > 0.0 { QMAX / amax } else { 0.0 };
            scale[col] = s;
            let (p, j) = (col / NR, col % NR);
            for (kk, &v) in row.iter().enumerate() {
                let (i, t) = (kk / 2, kk % 2);
                // Flat index into `panels` viewed as i16s.
                let at = ((p * pairs + i) * 2 + j / 8) * NR + (j % 8) * 2 + t;
                q[at] = quantise(v, inv);
            }
        }
        let panels = q
            .chunks_exact(2 * NR)
            .map(|c| {
                let mut cell = [[0i16; NR]; 2];
                cell[0].copy_from_slice(&c[..NR]);
                cell[1].copy_from_slice(&c[NR..]);
                cell
            })
            .collect();
        Ok(Self {
            k,
            n,
            pairs,
            panels,
            scale,
            bias,
        })
    }
}

/// `v · inv` rounded to the nearest integer (ties to even) in [-127, 127].
#[inline(always)]
fn quantise(v: f32, inv: f32) -> i16 {
    round_even((v * inv).clamp(-QMAX, QMAX)).0 as i16
}

/// The largest magnitude in `v`.
#[inline(always)]
fn amax(v: &[f32]) -> f32 {
    fold8(v, 0.0, |m, x| m.max(x.abs()))
}

/// What the epilogue does after scaling back and adding the bias.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Activation {
    /// Nothing.
    None,
    /// GELU, erf form.
    Gelu,
}

/// Quantises `rows` (each `k` long) with one scale per row, and packs
/// them in micro-tiles of [`MR`] rows: tile `t`, input pair `i` at
/// `t * pairs + i`, holding for each of the tile's rows its inputs `2i`
/// (low half) and `2i + 1` (high half). Rows past the last fill the last
/// tile with zeros.
#[inline(always)]
fn quantise_rows(rows: &[f32], k: usize, pairs: usize) -> (Vec<[i32; MR]>, Vec<f32>) {
    let m = rows.len() / k;
    let mut packed = vec![[0i32; MR]; m.div_ceil(MR) * pairs];
    let mut scales = vec![0f32; m];
    // One row's quantised values, zero past `k`.
    let mut q = vec![0i16; 2 * pairs];
    for (r, (row, s)) in rows.chunks_exact(k).zip(scales.iter_mut()).enumerate() {
        let amax = amax(row);
        *s = amax / QMAX;
        let inv = if amax > 0.0 { QMAX / amax } else { 0.0 };
        for (o, &v) in q.iter_mut().zip(row) {
            *o = quantise(v, inv);
        }
        let (t, lane) = (r / MR, r % MR);
        for (cell, pair) in packed[t * pairs..(t + 1) * pairs]
            .iter_mut()
            .zip(q.chunks_exact(2))
        {
            cell[lane] = i32::from(pair[0] as u16) | (i32::from(pair[1]) << 16);
        }
    }
    (packed, scales)
}

/// Runs one task's rows: quantise them, then every panel × micro-tile.
#[inline(always)]
fn task(
    simd: simd::Simd,
    w: &Int8Weight,
    x: &[f32],
    residual: Option<&[f32]>,
    act: Activation,
    norm: Option<&NormParams>,
    out: &mut [f32],
) {
    let (packed, sx) = quantise_rows(x, w.k, w.pairs);
    let m = sx.len();
    // Scale and bias are padded to whole panels.
    let (scales, _) = w.scale.as_chunks::<NR>();
    let (biases, _) = w.bias.as_chunks::<NR>();
    for (p, ((panel, sw), b)) in w
        .panels
        .chunks_exact(w.pairs)
        .zip(scales)
        .zip(biases)
        .enumerate()
    {
        let c0 = p * NR;
        let width = NR.min(w.n - c0);
        for (t, rows) in packed.chunks_exact(w.pairs).enumerate() {
            let r0 = t * MR;
            let sums = simd.tile(rows, panel);
            for (i, s) in sums.iter().take(m - r0).enumerate() {
                let v = epilogue(s, sx[r0 + i], sw, b, act);
                let at = (r0 + i) * w.n + c0;
                store(
                    &v,
                    residual.map(|res| &res[at..at + width]),
                    &mut out[at..at + width],
                );
            }
        }
    }
    // The task's rows are whole now, and still in cache.
    if let Some(norm) = norm {
        for row in out.chunks_exact_mut(w.n) {
            normalise(row, norm);
        }
    }
}

/// `act(s[j] · sx · sw[j] + b[j])` for one row of a tile: whole 16-wide
/// arrays, so that it compiles to straight SIMD code.
#[inline(always)]
fn epilogue(s: &[i32; NR], sx: f32, sw: &[f32; NR], b: &[f32; NR], act: Activation) -> [f32; NR] {
    let mut v = [0f32; NR];
    for (((v, &s), &sw), &b) in v.iter_mut().zip(s).zip(sw).zip(b) {
        *v = s as f32 * (sx * sw) + b;
    }
    if act == Activation::Gelu {
        for v in &mut v {
            *v = gelu(*v);
        }
    }
    v
}

/// `o = v (+ res)`, `o` the row's columns of this panel (16, or fewer in
/// the last panel).
#[inline(always)]
fn store(v: &[f32; NR], res: Option<&[f32]>, o: &mut [f32]) {
    if let (Ok(o), Some(Ok(res))) = (
        <&mut [f32; NR]>::try_from(&mut *o),
        res.map(<&[f32; NR]>::try_from),
    ) {
        for ((o, &v), &r) in o.iter_mut().zip(v).zip(res) {
            *o = v + r;
        }
        return;
    }
    match res {
        Some(res) => {
            for ((o, &v), &r) in o.iter_mut().zip(v).zip(res) {
                *o = v + r;
            }
        }
        None => {
            for (o, &v) in o.iter_mut().zip(v) {
                *o = v;
            }
        }
    }
}

/// `act(x · Wᵀ + b) (+ residual)`, then layer-normed when `norm` is given,
/// for `x` of `m × k` rows.
fn run(
    w: &Int8Weight,
    x: &[f32],
    residual: Option<&[f32]>,
    act: Activation,
    norm: Option<&NormParams>,
) -> candle_core::Result<Vec<f32>> {
    let Some(simd) = simd::Simd::try_new() else {
        candle_core::bail!("int8 linear: this CPU lacks AVX2");
    };
    if w.k == 0 || !x.len().is_multiple_of(w.k) {
        candle_core::bail!("int8 linear: {} values are not rows of {}", x.len(), w.k);
    }
    let m = x.len() / w.k;
    if residual.is_some_and(|r| r.len() != m * w.n) {
        candle_core::bail!("int8 linear: residual is not {m} rows of {}", w.n);
    }
    if let Some(norm) = norm
        && norm.len() != w.n
    {
        candle_core::bail!(
            "int8 linear: layer norm of {} after {} outputs",
            norm.len(),
            w.n
        );
    }
    let mut out = vec![0f32; m * w.n];
    out.par_chunks_mut(ROWS_PER_TASK * w.n)
        .zip(x.par_chunks(ROWS_PER_TASK * w.k))
        .enumerate()
        .for_each(|(t, (o, x))| {
            let at = t * ROWS_PER_TASK * w.n;
            let res = residual.map(|r| &r[at..at + o.len()]);
            // The closure must inline into the AVX2 function to be compiled
            // for it.
            simd.vectorize(
                #[inline(always)]
                || task(simd, w, x, res, act, norm, o),
            );
        });
    Ok(out)
}

/// The shape of `x` with its last dimension replaced by `n`.
fn out_shape(layout: &Layout, k: usize, n: usize) -> candle_core::Result<Shape> {
    let mut dims = layout.dims().to_vec();
    match dims.last_mut() {
        Some(d) if *d == k => *d = n,
        _ => candle_core::bail!("int8 linear: input {:?}, inner size {k}", layout.dims()),
    }
    Ok(Shape::from(dims))
}

/// The op: the weight, the activation, and the layer norm after it.
struct Linear<'a>(&'a Int8Weight, Activation, Option<&'a NormParams>);

impl CustomOp1 for Linear<'_> {
    fn name(&self) -> &'static str {
        "minions-int8-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let shape = out_shape(l, self.0.k, self.0.n)?;
        let out = run(self.0, contiguous_f32(OP, s, l)?, None, self.1, self.2)?;
        Ok((CpuStorage::F32(out), shape))
    }
}

impl CustomOp2 for Linear<'_> {
    fn name(&self) -> &'static str {
        "minions-int8-linear-residual"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        rs: &CpuStorage,
        rl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let shape = out_shape(l, self.0.k, self.0.n)?;
        if rl.shape() != &shape {
            candle_core::bail!("int8 linear: residual {:?}, output {shape:?}", rl.dims());
        }
        let out = run(
            self.0,
            contiguous_f32(OP, s, l)?,
            Some(contiguous_f32(OP, rs, rl)?),
            self.1,
            self.2,
        )?;
        Ok((CpuStorage::F32(out), shape))
    }
}

/// `act(x · Wᵀ + b)`, plus `residual` when given, then layer-normed when
/// `norm` is given; `x` an f32 CPU tensor whose last dimension is the
/// weight's input size.
pub(crate) fn linear(
    w: &Int8Weight,
    x: &Tensor,
    act: Activation,
    residual: Option<&Tensor>,
    norm: Option<&NormParams>,
) -> candle_core::Result<Tensor> {
    let x = x.contiguous()?;
    let op = Linear(w, act, norm);
    match residual {
        None => x.apply_op1_no_bwd(&op),
        Some(r) => x.apply_op2_no_bwd(&r.contiguous()?, &op),
    }
}

/// The SIMD micro-kernel, through `pulp`'s safe wrappers of the AVX2
/// intrinsics.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{MR, NR};
    use pulp::bytemuck::cast;
    use pulp::x86::V3;
    use std::arch::x86_64::__m256i;

    /// Proof that the CPU has AVX2 (and the rest of x86-64-v3).
    #[derive(Clone, Copy)]
    pub(super) struct Simd(V3);

    impl Simd {
        pub(super) fn try_new() -> Option<Self> {
            V3::try_new().map(Self)
        }

        /// Runs `f` compiled for x86-64-v3: what it inlines uses AVX2 and
        /// FMA.
        #[inline(always)]
        pub(super) fn vectorize<R>(self, f: impl FnOnce() -> R) -> R {
            self.0.vectorize(f)
        }

        /// The product of one micro-tile of packed rows with one panel:
        /// `MR × 16` integer sums.
        #[inline(always)]
        pub(super) fn tile(self, rows: &[[i32; MR]], panel: &[[[i16; NR]; 2]]) -> [[i32; NR]; MR] {
            let v3 = self.0;
            v3.vectorize(
                #[inline(always)]
                || {
                    let zero = v3.avx._mm256_setzero_si256();
                    let mut acc = [[zero; 2]; MR];
                    for (cell, rows) in panel.iter().zip(rows) {
                        let w0: __m256i = cast(cell[0]);
                        let w1: __m256i = cast(cell[1]);
                        for (acc, &row) in acc.iter_mut().zip(rows) {
                            let a = v3.avx._mm256_set1_epi32(row);
                            acc[0] = v3
                                .avx2
                                ._mm256_add_epi32(acc[0], v3.avx2._mm256_madd_epi16(a, w0));
                            acc[1] = v3
                                .avx2
                                ._mm256_add_epi32(acc[1], v3.avx2._mm256_madd_epi16(a, w1));
                        }
                    }
                    cast(acc)
                },
            )
        }
    }
}

/// Elsewhere the kernel is not available; callers use candle's.
#[cfg(not(target_arch = "x86_64"))]
mod simd {
    use super::{MR, NR};

    /// Never constructed off x86-64.
    #[derive(Clone, Copy)]
    pub(super) struct Simd(());

    impl Simd {
        pub(super) fn try_new() -> Option<Self> {
            None
        }

        pub(super) fn vectorize<R>(self, f: impl FnOnce() -> R) -> R {
            f()
        }

        pub(super) fn tile(
            self,
            _rows: &[[i32; MR]],
            _panel: &[[[i16; NR]; 2]],
        ) -> [[i32; NR]; MR] {
            [[0; NR]; MR]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Deterministic values in [-1, 1) with a few larger outliers, as
    /// transformer activations have.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (0..n)
            .map(|i| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let v = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                if i % 97 == 0 { v * 8.0 } else { v }
            })
            .collect()
    }

    /// The kernel's exact integer arithmetic, written plainly.
    fn reference(w: &Int8Weight, x: &[f32], act: Activation, res: Option<&[f32]>) -> Vec<f32> {
        let (packed, sx) = quantise_rows(x, w.k, w.pairs);
        let mut out = vec![0f32; sx.len() * w.n];
        for r in 0..sx.len() {
            let a = &packed[(r / MR) * w.pairs..(r / MR + 1) * w.pairs];
            for c in 0..w.n {
                let (p, j) = (c / NR, c % NR);
                let mut s = 0i32;
                for (i, pair) in a.iter().enumerate() {
                    let pair = pair[r % MR];
                    let cell = &w.panels[p * w.pairs + i][j / 8];
                    let (lo, hi) = (pair << 16 >> 16, pair >> 16);
                    s += lo * i32::from(cell[(j % 8) * 2]) + hi * i32::from(cell[(j % 8) * 2 + 1]);
                }
                let at = r * w.n + c;
                let mut v = s as f32 * (sx[r] * w.scale[c]) + w.bias[c];
                if act == Activation::Gelu {
                    v = gelu(v);
                }
                out[at] = v + res.map_or(0.0, |res| res[at]);
            }
        }
        out
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
    }

    /// Odd sizes (rows off the tile, columns off the panel, an odd inner
    /// size): the SIMD path gives the plain integer arithmetic's result.
    #[test]
    fn kernel_matches_plain_arithmetic() -> candle_core::Result<()> {
        if !available() {
            return Ok(());
        }
        let dev = Device::Cpu;
        let (m, k, n) = (61, 45, 37);
        let w = Tensor::from_vec(values(n * k, 1), (n, k), &dev)?;
        let b = Tensor::from_vec(values(n, 2), n, &dev)?;
        let x = Tensor::from_vec(values(m * k, 3), (m, k), &dev)?;
        let r = Tensor::from_vec(values(m * n, 4), (m, n), &dev)?;
        let q = Int8Weight::new(&w, &b)?;
        let xs = values(m * k, 3);
        let rs = values(m * n, 4);
        for act in [Activation::None, Activation::Gelu] {
            let ours = linear(&q, &x, act, None, None)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            assert_eq!(max_diff(&ours, &reference(&q, &xs, act, None)), 0.0);
            let ours = linear(&q, &x, act, Some(&r), None)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            assert_eq!(max_diff(&ours, &reference(&q, &xs, act, Some(&rs))), 0.0);
        }
        // With the layer norm fused: the same as normalising afterwards.
        let p = NormParams::new(values(n, 5), values(n, 6), 1e-12)?;
        let ours = linear(&q, &x, Activation::None, Some(&r), Some(&p))?;
        let mut theirs = reference(&q, &xs, Activation::None, Some(&rs));
        for row in theirs.chunks_exact_mut(n) {
            normalise(row, &p);
        }
        assert_eq!(max_diff(&ours.flatten_all()?.to_vec1()?, &theirs), 0.0);
        let wrong = NormParams::new(vec![1.0; n + 1], vec![0.0; n + 1], 1e-12)?;
        let err = linear(&q, &x, Activation::None, None, Some(&wrong)).err();
        assert!(err.is_some_and(|e| e.to_string().contains("layer norm of 38 after 37")));
        Ok(())
    }

    /// Against the f32 product: errors of the size int8 rounding makes.
    #[test]
    fn close_to_the_f32_product() -> candle_core::Result<()> {
        if !available() {
            return Ok(());
        }
        let dev = Device::Cpu;
        let (m, k, n) = (100, 384, 96);
        let w = Tensor::from_vec(values(n * k, 5), (n, k), &dev)?;
        let b = Tensor::from_vec(values(n, 6), n, &dev)?;
        let x = Tensor::from_vec(values(m * k, 7), (2, m / 2, k), &dev)?;
        let q = Int8Weight::new(&w, &b)?;
        let ours = linear(&q, &x, Activation::None, None, None)?;
        assert_eq!(ours.dims(), &[2, m / 2, n]);
        let f32s = x.broadcast_matmul(&w.t()?)?.broadcast_add(&b)?;
        // Relative error, root mean square: with outliers 8× the typical
        // value in both operands, one int8 step is 1/16 of a typical value.
        let err = (&ours - &f32s)?
            .sqr()?
            .mean_all()?
            .sqrt()?
            .to_scalar::<f32>()?;
        let rms = f32s.sqr()?.mean_all()?.sqrt()?.to_scalar::<f32>()?;
        assert!(err > 0.0, "quantisation changed nothing");
        assert!(err < 0.05 * rms, "rms error {err} against rms {rms}");
        Ok(())
    }

    #[test]
    fn refuses_a_wrong_inner_size() -> candle_core::Result<()> {
        if !available() {
            return Ok(());
        }
        let dev = Device::Cpu;
        let w = Tensor::zeros((8, 4), candle_core::DType::F32, &dev)?;
        let b = Tensor::zeros(8, candle_core::DType::F32, &dev)?;
        let q = Int8Weight::new(&w, &b)?;
        let x = Tensor::zeros((3, 5), candle_core::DType::F32, &dev)?;
        let err = linear(&q, &x, Activation::None, None, None)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("inner size 4")));
        Ok(())
    }
}
/// Side by side on one machine: candle's f32 product against this kernel,
/// at the shapes of a MiniLM layer. Not run by CI; BENCHMARKS.md gives the
/// command and the figures.
#[cfg(test)]
mod speed {
    use super::*;

    #[test]
    #[ignore = "a measurement: run with --release --ignored --nocapture"]
    fn int8_against_f32_products() -> candle_core::Result<()> {
        let dev = candle_core::Device::Cpu;
        let reps = 20;
        for (m, k, n) in [(2048, 384, 1152), (2048, 384, 1536), (2048, 1536, 384)] {
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
            let b = Tensor::zeros(n, candle_core::DType::F32, &dev)?;
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
            let wt = w.t()?.contiguous()?;
            let q = Int8Weight::new(&w, &b)?;
            let (mut f, mut i) = (
                x.matmul(&wt)?,
                linear(&q, &x, Activation::None, None, None)?,
            );
            let t = std::time::Instant::now();
            for _ in 0..reps {
                f = x.matmul(&wt)?;
            }
            let tf = t.elapsed().as_secs_f64() / f64::from(reps);
            let t = std::time::Instant::now();
            for _ in 0..reps {
                i = linear(&q, &x, Activation::None, None, None)?;
            }
            let ti = t.elapsed().as_secs_f64() / f64::from(reps);
            let err = (&f - &i)?.sqr()?.mean_all()?.sqrt()?.to_scalar::<f32>()?;
            let rms = f.sqr()?.mean_all()?.sqrt()?.to_scalar::<f32>()?;
            assert!(err < 0.02 * rms, "rms error {err} against rms {rms}");
            let gmac = (m * k * n) as f64 / 1e9;
            eprintln!(
                "{m}x{k}x{n}: f32 {:.1} GMAC/s, int8 {:.1} GMAC/s, int8/f32 {:.2}",
                gmac / tf,
                gmac / ti,
                tf / ti
            );
        }
        Ok(())
    }
}
