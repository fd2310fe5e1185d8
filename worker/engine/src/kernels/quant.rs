//! Quantized matrix products in ggml's block formats (Q4_1, Q8_0) on the
//! CPU, computing each output exactly as llama.cpp's CPU backend does.
//!
//! Activations are quantized per row in blocks of 32 (Q8_1 beside Q4_1
//! weights, Q8_0 beside Q8_0), with ggml's scale (`amax / 127`), inverse
//! (`127 / amax`) and round-half-to-even. Each output is one dot product
//! over the whole row: per block, the integer products summed in eight
//! lanes of four, scaled and accumulated with fused multiply-adds in lane
//! order, the lanes added as ggml's `hsum_float_8` adds them, then (Q4_1)
//! the minimums' term. So an output depends on its own row only, never on
//! which rows share the product, and matches llama.cpp bit for bit.
//!
//! candle's own Q4_1 product is scalar; this one takes the best
//! [`CpuPath`] the CPU runs: `vpdpbusd` on 256-bit registers for the byte
//! products where it has it (AVX-VNNI's form, or AVX-512 VNNI's on the
//! AVX-512 path: CPUs such as AMD's Zen 4 have only the latter), AVX2
//! (`pulp`'s run-time check) otherwise, and a portable path of the same
//! arithmetic elsewhere, all the same bits. Four rows share each unpacked
//! weight block.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use half::f16;
use rayon::prelude::*;

use super::{CpuPath, contiguous_f32, hsum8, round_even};

/// The op's name in errors.
const OP: &str = "quantized linear";
/// Values per block.
const QK: usize = 32;
/// Rows computed together against one weight block.
const MR: usize = 4;
/// Products of fewer multiply-adds than this run on the calling thread.
const SERIAL_MACS: usize = 1 << 17;
/// Output columns per parallel task, at least.
const COLS_PER_TASK: usize = 16;
/// Columns moved into rows together: one cache line of each row.
const TRANSPOSE_COLS: usize = 16;

/// A weight matrix `(n, k)` in one of the block formats, unpacked into
/// arrays of scales and quants.
pub(crate) struct QuantWeight {
    n: usize,
    k: usize,
    /// Blocks per row: `k / 32`.
    kb: usize,
    /// Per block: scale (f16 widened).
    d: Vec<f32>,
    /// Per block, Q4_1 only: minimum (f16 widened).
    m: Vec<f32>,
    /// Per block, Q4_1: 16 bytes of nibble pairs (element j low, j + 16
    /// high); Q8_0: 32 signed bytes.
    q4: Vec<[u8; 16]>,
    q8: Vec<[i8; 32]>,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Q4_1,
    Q8_0,
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

impl QuantWeight {
    /// Unpacks `t` (`(n, k)`, a CPU tensor) when it is Q4_1 or Q8_0 with
    /// `k` a multiple of 32; `None` for other formats (callers use
    /// candle's product for those).
    pub(crate) fn from_qtensor(t: &QTensor) -> candle_core::Result<Option<Self>> {
        let kind = match t.dtype() {
            GgmlDType::Q4_1 => Kind::Q4_1,
            GgmlDType::Q8_0 => Kind::Q8_0,
            _ => return Ok(None),
        };
        let (n, k) = t.shape().dims2()?;
        if k % QK != 0 {
            return Ok(None);
        }
        let kb = k / QK;
        let data = t.data()?;
        let size = match kind {
            Kind::Q4_1 => 20,
            Kind::Q8_0 => 34,
        };
        if data.len() != n * kb * size {
            candle_core::bail!("{OP}: {} bytes for {n} × {k} in {:?}", data.len(), kind);
        }
        let blocks = n * kb;
        let mut w = Self {
            n,
            k,
            kb,
            d: Vec::with_capacity(blocks),
            m: Vec::new(),
            q4: Vec::new(),
            q8: Vec::new(),
            kind,
        };
        for b in data.chunks_exact(size) {
            w.d.push(f16_at(b, 0));
            match kind {
                Kind::Q4_1 => {
                    w.m.push(f16_at(b, 2));
                    let mut q = [0u8; 16];
                    q.copy_from_slice(&b[4..20]);
                    w.q4.push(q);
                }
                Kind::Q8_0 => {
                    let mut q = [0i8; 32];
                    for (o, &x) in q.iter_mut().zip(&b[2..34]) {
                        *o = x as i8;
                    }
                    w.q8.push(q);
                }
            }
        }
        Ok(Some(w))
    }

    /// Output columns.
    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// The weights of `parts` stacked into one, their output columns one
    /// after another, when all are of one format and input width; `None`
    /// otherwise. Each output column is its own dot product over the row,
    /// so one product of the stack gives each part's values exactly, in
    /// one pass over the input and one round of the pool instead of one
    /// per part.
    pub(crate) fn stack(parts: &[&QuantWeight]) -> Option<QuantWeight> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.kind != first.kind || p.k != first.k) {
            return None;
        }
        let mut w = Self {
            n: parts.iter().map(|p| p.n).sum(),
            k: first.k,
            kb: first.kb,
            d: Vec::new(),
            m: Vec::new(),
            q4: Vec::new(),
            q8: Vec::new(),
            kind: first.kind,
        };
        for p in parts {
            w.d.extend_from_slice(&p.d);
            w.m.extend_from_slice(&p.m);
            w.q4.extend_from_slice(&p.q4);
            w.q8.extend_from_slice(&p.q8);
        }
        Some(w)
    }
}

/// Rows of activations quantized per block of 32.
struct Acts {
    /// Per block: scale, f16-rounded as ggml stores it.
    d: Vec<f32>,
    /// Per block (Q8_1): `d · Σq`, f16-rounded.
    s: Vec<f32>,
    q: Vec<[i8; 32]>,
    /// `d` of each group of [`MR`] whole rows, the group's rows side by
    /// side per block: group `g`, block `b` at `g · kb + b`.
    d4: Vec<[f32; MR]>,
    /// `s` laid out as `d4` (Q8_1 only).
    s4: Vec<[f32; MR]>,
}

/// ggml's `quantize_row_q8_1` / `quantize_row_q8_0` of every row of `x`.
fn quantize(x: &[f32], rows: usize, k: usize, with_sums: bool) -> Acts {
    let kb = k / QK;
    let mut a = Acts {
        d: vec![0.0; rows * kb],
        s: if with_sums {
            vec![0.0; rows * kb]
        } else {
            Vec::new()
        },
        q: vec![[0; 32]; rows * kb],
        d4: Vec::new(),
        s4: Vec::new(),
    };
    for (i, block) in x.chunks_exact(QK).enumerate() {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (o, &v) in a.q[i].iter_mut().zip(block) {
            let r = round_even((v * id).clamp(-128.0, 127.0)).0;
            sum += r;
            *o = r as i8;
        }
        a.d[i] = f16::from_f32(d).to_f32();
        if with_sums {
            a.s[i] = f16::from_f32(d * sum as f32).to_f32();
        }
    }
    let side_by_side = |v: &[f32]| -> Vec<[f32; MR]> {
        (0..rows / MR)
            .flat_map(|g| (0..kb).map(move |b| (g, b)))
            .map(|(g, b)| std::array::from_fn(|i| v[(g * MR + i) * kb + b]))
            .collect()
    };
    a.d4 = side_by_side(&a.d);
    if with_sums {
        a.s4 = side_by_side(&a.s);
    }
    a
}

/// Integer products of one block summed four at a time: lane `l` holds
/// elements `4l..4l + 4`.
#[inline(always)]
fn lane_sums(x: &[i8; 32], y: &[i8; 32]) -> [f32; 8] {
    let mut out = [0f32; 8];
    for (l, o) in out.iter_mut().enumerate() {
        let mut s = 0i32;
        for j in 4 * l..4 * l + 4 {
            s += i32::from(x[j]) * i32::from(y[j]);
        }
        *o = s as f32;
    }
    out
}

/// The nibbles of a Q4_1 block as 32 bytes in element order.
#[inline(always)]
fn unpack4(q: &[u8; 16]) -> [i8; 32] {
    let mut out = [0i8; 32];
    for j in 0..16 {
        out[j] = (q[j] & 0x0f) as i8;
        out[j + 16] = (q[j] >> 4) as i8;
    }
    out
}

/// The portable path: the same arithmetic, lane by lane.
fn dot_plain(w: &QuantWeight, a: &Acts, col: usize, row: usize) -> f32 {
    let (wb, ab) = (col * w.kb, row * w.kb);
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for b in 0..w.kb {
        let (x, scale) = match w.kind {
            Kind::Q4_1 => {
                summs = w.m[wb + b].mul_add(a.s[ab + b], summs);
                (unpack4(&w.q4[wb + b]), w.d[wb + b] * a.d[ab + b])
            }
            Kind::Q8_0 => (w.q8[wb + b], w.d[wb + b] * a.d[ab + b]),
        };
        let lanes = lane_sums(&x, &a.q[ab + b]);
        for (acc, v) in acc.iter_mut().zip(lanes) {
            *acc = scale.mul_add(v, *acc);
        }
    }
    hsum8(acc) + summs
}

/// `x · Wᵀ` for `x` of `rows × k` (row-major), into `out` (`rows × n`).
fn product(w: &QuantWeight, x: &[f32], rows: usize, out: &mut [f32]) {
    product_on(CpuPath::get(), w, x, rows, out);
}

/// [`product`] on the kernels of `path` (or the best below it this CPU
/// runs).
fn product_on(path: CpuPath, w: &QuantWeight, x: &[f32], rows: usize, out: &mut [f32]) {
    let a = quantize(x, rows, w.k, w.kind == Kind::Q4_1);
    let simd = match path {
        CpuPath::Portable => None,
        p => simd::Simd::try_new(p).or_else(|| simd::Simd::try_new(CpuPath::Avx2)),
    };
    let n = w.n;
    // A band of columns per task, enough tasks to balance the threads
    // without paying for thousands of tiny ones (the output layer has
    // tens of thousands of columns).
    let threads = rayon::current_num_threads().max(1);
    let band = (n / (threads * 8))
        .next_multiple_of(COLS_PER_TASK)
        .max(COLS_PER_TASK);
    let fill = |c0: usize, vals: &mut [f32]| {
        let c1 = c0 + vals.len() / rows;
        match simd {
            Some(s) => s.band(w, &a, c0..c1, rows, vals),
            None => {
                for c in c0..c1 {
                    for r in 0..rows {
                        vals[(c - c0) * rows + r] = dot_plain(w, &a, c, r);
                    }
                }
            }
        }
    };
    // Small products run on this thread: waking the pool costs more.
    let small = rows * n * w.k < SERIAL_MACS;
    if rows == 1 {
        // One row: column-major is row-major.
        if small {
            fill(0, out);
        } else {
            out.par_chunks_mut(band)
                .enumerate()
                .for_each(|(i, vals)| fill(i * band, vals));
        }
        return;
    }
    let mut cols = vec![0f32; n * rows];
    cols.par_chunks_mut(band * rows)
        .enumerate()
        .for_each(|(i, vals)| fill(i * band, vals));
    // Into rows, sixteen columns (a cache line of each row) at a time:
    // column by column, every store went to another row, and rows whose
    // stride is a multiple of 4 KiB share a few cache sets.
    for (block, chunk) in cols.chunks(TRANSPOSE_COLS * rows).enumerate() {
        let c0 = block * TRANSPOSE_COLS;
        let width = chunk.len() / rows;
        for r in 0..rows {
            for (j, o) in out[r * n + c0..][..width].iter_mut().enumerate() {
                *o = chunk[j * rows + r];
            }
        }
    }
}

/// The op: `x · Wᵀ` over the last dimension of `x`.
struct Linear<'a>(&'a QuantWeight);

impl CustomOp1 for Linear<'_> {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(OP, s, l)?;
        let dims = l.dims();
        let Some((&k, lead)) = dims.split_last() else {
            candle_core::bail!("{OP}: a scalar input");
        };
        if k != self.0.k {
            candle_core::bail!("{OP}: input of {k} features for a weight of {}", self.0.k);
        }
        let rows: usize = lead.iter().product();
        let mut out = vec![0f32; rows * self.0.n];
        product(self.0, x, rows, &mut out);
        let mut shape = lead.to_vec();
        shape.push(self.0.n);
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }
}

/// `x · Wᵀ`: `x` an f32 CPU tensor whose last dimension is `k`.
pub(crate) fn quant_linear(
    w: &QuantWeight,
    x: &candle_core::Tensor,
) -> candle_core::Result<candle_core::Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&Linear(w))
}

/// The AVX2 path.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{Acts, CpuPath, Kind, MR, QuantWeight, hsum8};
    use pulp::bytemuck::cast;
    use pulp::x86::V3;
    use std::arch::x86_64::{__m128, __m128i, __m256, __m256i};

    /// A Q4_1 block's nibbles as 32 bytes in element order: low half the
    /// low nibbles, high half the high ones.
    #[inline(always)]
    fn nibbles(v3: V3, q: [u8; 16]) -> __m256i {
        let q: __m128i = cast(q);
        let hi = v3.sse2._mm_srli_epi16::<4>(q);
        v3.avx2
            ._mm256_and_si256(v3.avx._mm256_set_m128i(hi, q), cast([0x0fu8; 32]))
    }

    /// Products of unsigned bytes `x` and signed bytes `y`, four summed per
    /// lane, as f32: lane `l` holds elements `4l..4l + 4`. With `DOT` 1
    /// AVX-VNNI's `vpdpbusd`, with 2 AVX-512 VNNI's (EVEX-encoded, the
    /// same instruction on 256 bits); with 0, `vpmaddubsw` then `vpmaddwd` (the pairs cannot
    /// saturate: |15 · 127 · 2| and |127 · 127 · 2| fit in i16 only for
    /// the first, and the second's operands are at most 127 in magnitude
    /// after the sign move, as ggml's). Both give the same sums.
    #[inline(always)]
    fn quads<const DOT: u8>(v3: V3, x: __m256i, y: __m256i) -> __m256 {
        let zero = v3.avx._mm256_setzero_si256();
        let sums = match DOT {
            // SAFETY: `quads::<1>` is reached only from `band_vnni`, which
            // runs only where the CPU reported AVX-VNNI (`Dot::AvxVnni`);
            // the intrinsic has no other precondition.
            #[allow(unsafe_code)]
            1 => unsafe { std::arch::x86_64::_mm256_dpbusd_avx_epi32(zero, x, y) },
            // SAFETY: `quads::<2>` is reached only from `band_vnni512`,
            // which runs only where the CPU reported AVX-512 F, BW, VL and
            // VNNI (`Dot::Avx512Vnni`); no other precondition.
            #[allow(unsafe_code)]
            2 => unsafe { std::arch::x86_64::_mm256_dpbusd_epi32(zero, x, y) },
            _ => {
                let pairs = v3.avx2._mm256_maddubs_epi16(x, y);
                v3.avx2._mm256_madd_epi16(pairs, cast([1i16; 16]))
            }
        };
        v3.avx._mm256_cvtepi32_ps(sums)
    }

    /// [`quads`] of two signed blocks: the weights' signs move onto the
    /// activations, since the instruction multiplies unsigned by signed.
    #[inline(always)]
    fn signed_quads<const DOT: u8>(v3: V3, x: __m256i, y: __m256i) -> __m256 {
        quads::<DOT>(
            v3,
            v3.avx2._mm256_sign_epi8(x, x),
            v3.avx2._mm256_sign_epi8(y, x),
        )
    }

    /// One block's lane sums `f` times its two scales' product, added to
    /// `acc` with one fused multiply-add, as ggml accumulates.
    #[inline(always)]
    fn scaled(v3: V3, scale: f32, f: __m256, acc: __m256) -> __m256 {
        v3.fma._mm256_fmadd_ps(v3.avx._mm256_set1_ps(scale), f, acc)
    }

    /// The outputs of `N` accumulators: lanes added in `hsum8`'s order,
    /// then the minimums' term (zero for Q8_0).
    #[inline(always)]
    fn finish<const N: usize>(v3: V3, acc: [__m256; N], summs: [__m128; N]) -> [f32; N] {
        std::array::from_fn(|i| hsum8(cast(acc[i])) + v3.sse._mm_cvtss_f32(summs[i]))
    }

    /// One Q4_1 weight column's blocks, scales and minimums.
    type Q41Column<'a> = (&'a [[u8; 16]], &'a [f32], &'a [f32]);

    /// One activation row's blocks, scales and sums.
    type RowBlocks<'a> = (&'a [[i8; 32]], &'a [f32], &'a [f32]);

    /// Which instruction sums the byte products.
    #[derive(Clone, Copy)]
    enum Dot {
        /// `vpmaddubsw` then `vpmaddwd`.
        Avx2,
        /// AVX-VNNI's `vpdpbusd`.
        AvxVnni,
        /// AVX-512 VNNI's `vpdpbusd` on 256-bit registers.
        Avx512Vnni,
    }

    /// Proof that the CPU has AVX2 and FMA, and which byte product it runs.
    #[derive(Clone, Copy)]
    pub(super) struct Simd(V3, Dot);

    impl Simd {
        /// The path `path` asks for, where the CPU runs it. Blocks are 32
        /// bytes, one 256-bit register, so the AVX-512 path takes its VNNI
        /// on 256 bits (AVX-VNNI's where the CPU lacks AVX-512's).
        pub(super) fn try_new(path: CpuPath) -> Option<Self> {
            let v3 = V3::try_new()?;
            match path {
                CpuPath::Portable => None,
                CpuPath::Avx2 => Some(Self(v3, Dot::Avx2)),
                CpuPath::Avx512 if CpuPath::has_avx512() => Some(Self(v3, Dot::Avx512Vnni)),
                CpuPath::Vnni | CpuPath::Avx512 => {
                    CpuPath::has_avx_vnni().then_some(Self(v3, Dot::AvxVnni))
                }
            }
        }

        /// Columns `cols` of every row into `out` (column-major: column
        /// `c - cols.start`, row `r` at `(c - start) · rows + r`).
        pub(super) fn band(
            self,
            w: &QuantWeight,
            a: &Acts,
            cols: std::ops::Range<usize>,
            rows: usize,
            out: &mut [f32],
        ) {
            let v3 = self.0;
            match self.1 {
                // SAFETY: `Dot::AvxVnni` is set only where the CPU
                // reported AVX-VNNI, and `v3` proves AVX2 and FMA: every
                // feature `band_vnni` is compiled for.
                #[allow(unsafe_code)]
                Dot::AvxVnni => unsafe { band_vnni(v3, w, a, cols, rows, out) },
                // SAFETY: `Dot::Avx512Vnni` is set only where the CPU
                // reported AVX-512 F, BW, VL and VNNI, and `v3` proves
                // AVX2 and FMA: every feature `band_vnni512` is compiled
                // for.
                #[allow(unsafe_code)]
                Dot::Avx512Vnni => unsafe { band_vnni512(v3, w, a, cols, rows, out) },
                Dot::Avx2 => v3.vectorize(
                    #[inline(always)]
                    || band_body::<0>(v3, w, a, cols, rows, out),
                ),
            }
        }
    }

    /// [`band_body`] compiled for AVX2, FMA and AVX-VNNI.
    #[target_feature(enable = "avx,avx2,fma,avxvnni")]
    fn band_vnni(
        v3: V3,
        w: &QuantWeight,
        a: &Acts,
        cols: std::ops::Range<usize>,
        rows: usize,
        out: &mut [f32],
    ) {
        band_body::<1>(v3, w, a, cols, rows, out)
    }

    /// [`band_body`] compiled for AVX2, FMA and AVX-512 VNNI (its 256-bit
    /// forms).
    #[target_feature(enable = "avx,avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn band_vnni512(
        v3: V3,
        w: &QuantWeight,
        a: &Acts,
        cols: std::ops::Range<usize>,
        rows: usize,
        out: &mut [f32],
    ) {
        band_body::<2>(v3, w, a, cols, rows, out)
    }

    /// Columns `cols` of every row into `out`, as [`Simd::band`] lays them.
    #[inline(always)]
    fn band_body<const DOT: u8>(
        v3: V3,
        w: &QuantWeight,
        a: &Acts,
        cols: std::ops::Range<usize>,
        rows: usize,
        out: &mut [f32],
    ) {
        let full = rows - rows % MR;
        for c in cols.clone() {
            let at = (c - cols.start) * rows;
            for r0 in (0..full).step_by(MR) {
                let sums = tile4::<DOT>(v3, w, a, c, r0 / MR);
                out[at + r0..][..MR].copy_from_slice(&sums);
            }
        }
        // Rows left over (all of them when decoding one sequence): four
        // columns at a time, so that four independent sums hide the
        // multiply-add latency.
        for r in full..rows {
            let mut c = cols.start;
            while c + MR <= cols.end {
                let sums = tile_cols::<MR, DOT>(v3, w, a, c, r);
                for (j, v) in sums.into_iter().enumerate() {
                    out[(c + j - cols.start) * rows + r] = v;
                }
                c += MR;
            }
            for c in c..cols.end {
                out[(c - cols.start) * rows + r] = tile::<1, DOT>(v3, w, a, c, r)[0];
            }
        }
    }

    /// Columns `c0..c0 + N` against row `r`: the same sums as [`tile`],
    /// one accumulator per column.
    #[inline(always)]
    fn tile_cols<const N: usize, const DOT: u8>(
        v3: V3,
        w: &QuantWeight,
        a: &Acts,
        c0: usize,
        r: usize,
    ) -> [f32; N] {
        let kb = w.kb;
        let zero: __m256 = cast([0f32; 8]);
        let mut acc = [zero; N];
        let mut summs = [v3.sse._mm_set_ss(0.0); N];
        let aq = &a.q[r * kb..][..kb];
        let ad = &a.d[r * kb..][..kb];
        match w.kind {
            Kind::Q4_1 => {
                let as_ = &a.s[r * kb..][..kb];
                let cols: [Q41Column<'_>; N] = std::array::from_fn(|j| {
                    let c = c0 + j;
                    (
                        &w.q4[c * kb..][..kb],
                        &w.d[c * kb..][..kb],
                        &w.m[c * kb..][..kb],
                    )
                });
                for b in 0..kb {
                    let y: __m256i = cast(aq[b]);
                    let s = v3.sse._mm_set_ss(as_[b]);
                    for j in 0..N {
                        let (wq, wd, wm) = cols[j];
                        let f = quads::<DOT>(v3, nibbles(v3, wq[b]), y);
                        acc[j] = scaled(v3, wd[b] * ad[b], f, acc[j]);
                        summs[j] = v3.fma._mm_fmadd_ss(v3.sse._mm_set_ss(wm[b]), s, summs[j]);
                    }
                }
            }
            Kind::Q8_0 => {
                let cols: [(&[[i8; 32]], &[f32]); N] = std::array::from_fn(|j| {
                    let c = c0 + j;
                    (&w.q8[c * kb..][..kb], &w.d[c * kb..][..kb])
                });
                for b in 0..kb {
                    let y: __m256i = cast(aq[b]);
                    for j in 0..N {
                        let (wq, wd) = cols[j];
                        let f = signed_quads::<DOT>(v3, cast(wq[b]), y);
                        acc[j] = scaled(v3, wd[b] * ad[b], f, acc[j]);
                    }
                }
            }
        }
        finish(v3, acc, summs)
    }

    // `tile4` holds a group's rows in the four lanes of one 128-bit vector.
    const _: () = assert!(MR == 4);

    /// Column `c` against the [`MR`] rows of group `g`: the sums of
    /// [`tile`], with the rows' scale products and minimums' terms one
    /// vector operation per block for all four (each lane the same
    /// multiply or fused multiply-add as [`tile`]'s scalar one).
    #[inline(always)]
    fn tile4<const DOT: u8>(v3: V3, w: &QuantWeight, a: &Acts, c: usize, g: usize) -> [f32; MR] {
        let kb = w.kb;
        let zero: __m256 = cast([0f32; 8]);
        let mut acc = [zero; MR];
        let mut summs = v3.sse._mm_setzero_ps();
        let wd = &w.d[c * kb..][..kb];
        let d4 = &a.d4[g * kb..][..kb];
        let rows: [&[[i8; 32]]; MR] = std::array::from_fn(|i| &a.q[(g * MR + i) * kb..][..kb]);
        let lane: [__m256i; MR] = std::array::from_fn(|i| cast([i as i32; 8]));
        // Lane `i` of `scales` in every lane.
        let spread = |scales: __m128, i: usize| -> __m256 {
            v3.avx2
                ._mm256_permutevar8x32_ps(v3.avx._mm256_castps128_ps256(scales), lane[i])
        };
        match w.kind {
            Kind::Q4_1 => {
                let wq = &w.q4[c * kb..][..kb];
                let wm = &w.m[c * kb..][..kb];
                let s4 = &a.s4[g * kb..][..kb];
                for b in 0..kb {
                    let x = nibbles(v3, wq[b]);
                    let scales = v3.sse._mm_mul_ps(v3.sse._mm_set1_ps(wd[b]), cast(d4[b]));
                    summs = v3
                        .fma
                        ._mm_fmadd_ps(v3.sse._mm_set1_ps(wm[b]), cast(s4[b]), summs);
                    for i in 0..MR {
                        let f = quads::<DOT>(v3, x, cast(rows[i][b]));
                        acc[i] = v3.fma._mm256_fmadd_ps(spread(scales, i), f, acc[i]);
                    }
                }
            }
            Kind::Q8_0 => {
                let wq = &w.q8[c * kb..][..kb];
                for b in 0..kb {
                    let x: __m256i = cast(wq[b]);
                    let scales = v3.sse._mm_mul_ps(v3.sse._mm_set1_ps(wd[b]), cast(d4[b]));
                    for i in 0..MR {
                        let f = signed_quads::<DOT>(v3, x, cast(rows[i][b]));
                        acc[i] = v3.fma._mm256_fmadd_ps(spread(scales, i), f, acc[i]);
                    }
                }
            }
        }
        let summs: [f32; MR] = cast(summs);
        std::array::from_fn(|i| hsum8(cast(acc[i])) + summs[i])
    }

    /// Column `c` against rows `r0..r0 + N`.
    #[inline(always)]
    fn tile<const N: usize, const DOT: u8>(
        v3: V3,
        w: &QuantWeight,
        a: &Acts,
        c: usize,
        r0: usize,
    ) -> [f32; N] {
        let kb = w.kb;
        let zero: __m256 = cast([0f32; 8]);
        let mut acc = [zero; N];
        // The minimums' term, one fused multiply-add per block as ggml's.
        let mut summs = [v3.sse._mm_set_ss(0.0); N];
        let wd = &w.d[c * kb..][..kb];
        // Each row's blocks, scales and sums as slices of the block count:
        // the loop below indexes them without bounds checks.
        let rows: [RowBlocks<'_>; N] = std::array::from_fn(|i| {
            let r = r0 + i;
            (
                &a.q[r * kb..][..kb],
                &a.d[r * kb..][..kb],
                if a.s.is_empty() {
                    &a.d[r * kb..][..kb]
                } else {
                    &a.s[r * kb..][..kb]
                },
            )
        });
        match w.kind {
            Kind::Q4_1 => {
                let wq = &w.q4[c * kb..][..kb];
                let wm = &w.m[c * kb..][..kb];
                for b in 0..kb {
                    let x = nibbles(v3, wq[b]);
                    let m = v3.sse._mm_set_ss(wm[b]);
                    for i in 0..N {
                        let (aq, ad, as_) = rows[i];
                        let f = quads::<DOT>(v3, x, cast(aq[b]));
                        acc[i] = scaled(v3, wd[b] * ad[b], f, acc[i]);
                        summs[i] = v3.fma._mm_fmadd_ss(m, v3.sse._mm_set_ss(as_[b]), summs[i]);
                    }
                }
            }
            Kind::Q8_0 => {
                let wq = &w.q8[c * kb..][..kb];
                for b in 0..kb {
                    let x: __m256i = cast(wq[b]);
                    for i in 0..N {
                        let (aq, ad, _) = rows[i];
                        let f = signed_quads::<DOT>(v3, x, cast(aq[b]));
                        acc[i] = scaled(v3, wd[b] * ad[b], f, acc[i]);
                    }
                }
            }
        }
        finish(v3, acc, summs)
    }
}

/// Elsewhere only the portable path runs.
#[cfg(not(target_arch = "x86_64"))]
mod simd {
    use super::{Acts, CpuPath, QuantWeight};

    /// Never constructed off x86-64.
    #[derive(Clone, Copy)]
    pub(super) struct Simd(());

    impl Simd {
        pub(super) fn try_new(_path: CpuPath) -> Option<Self> {
            None
        }

        pub(super) fn band(
            self,
            _w: &QuantWeight,
            _a: &Acts,
            _cols: std::ops::Range<usize>,
            _rows: usize,
            _out: &mut [f32],
        ) {
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Module, Tensor};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s % 20_001) as f32 / 10_000.0) - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_candle_and_the_portable_path() -> candle_core::Result<()> {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (n, k, rows) = (40, 128, 7);
            let wf = Tensor::from_vec(random(n * k, 3), (n, k), &Device::Cpu)?;
            let qt = QTensor::quantize(&wf, dtype)?;
            let w = QuantWeight::from_qtensor(&qt)?
                .ok_or(candle_core::Error::Msg("unsupported".into()))?;
            let x = Tensor::from_vec(random(rows * k, 9), (rows, k), &Device::Cpu)?;
            let ours: Vec<Vec<f32>> = quant_linear(&w, &x)?.to_vec2()?;
            let theirs: Vec<Vec<f32>> = candle_core::quantized::QMatMul::from_qtensor(qt)?
                .forward(&x)?
                .to_vec2()?;
            let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
            let a = quantize(&xs, rows, k, dtype == GgmlDType::Q4_1);
            for r in 0..rows {
                for c in 0..n {
                    // Same blocks, other rounding and order: close to candle's.
                    assert!(
                        (ours[r][c] - theirs[r][c]).abs() < 2e-2,
                        "{dtype:?} {r} {c}"
                    );
                    // The SIMD path is the portable one, bit for bit.
                    assert_eq!(ours[r][c].to_bits(), dot_plain(&w, &a, c, r).to_bits());
                }
            }
            // A row's output does not depend on the other rows.
            let one: Vec<Vec<f32>> = quant_linear(&w, &x.narrow(0, 3, 1)?)?.to_vec2()?;
            assert_eq!(one[0], ours[3]);
        }
        Ok(())
    }

    /// A stack's product is its parts' products side by side, bit for
    /// bit, for one row (decoding) and many; parts of two formats do not
    /// stack.
    #[test]
    fn a_stack_computes_its_parts_exactly() -> candle_core::Result<()> {
        let k = 96;
        let weight = |n: usize, seed: u64, dtype| -> candle_core::Result<QuantWeight> {
            let wf = Tensor::from_vec(random(n * k, seed), (n, k), &Device::Cpu)?;
            QuantWeight::from_qtensor(&QTensor::quantize(&wf, dtype)?)?
                .ok_or(candle_core::Error::Msg("unsupported".into()))
        };
        let parts = [
            weight(40, 1, GgmlDType::Q4_1)?,
            weight(24, 2, GgmlDType::Q4_1)?,
            weight(56, 3, GgmlDType::Q4_1)?,
        ];
        let refs: Vec<&QuantWeight> = parts.iter().collect();
        let stack = QuantWeight::stack(&refs).ok_or(candle_core::Error::Msg("no stack".into()))?;
        assert_eq!(stack.n(), 120);
        for rows in [1, 5] {
            let x = Tensor::from_vec(random(rows * k, 9), (rows, k), &Device::Cpu)?;
            let all: Vec<Vec<f32>> = quant_linear(&stack, &x)?.to_vec2()?;
            let mut at = 0;
            for p in &parts {
                let one: Vec<Vec<f32>> = quant_linear(p, &x)?.to_vec2()?;
                for (r, row) in one.iter().enumerate() {
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(row), bits(&all[r][at..at + p.n()]), "rows {rows}");
                }
                at += p.n();
            }
        }
        let q8 = weight(8, 4, GgmlDType::Q8_0)?;
        assert!(QuantWeight::stack(&[&parts[0], &q8]).is_none());
        Ok(())
    }

    /// Every instruction path this CPU runs, forced in turn, gives the
    /// portable path's bits, with row counts that take every tile shape
    /// and column counts that leave columns over.
    #[test]
    fn every_cpu_path_gives_the_same_bits() -> candle_core::Result<()> {
        let best = CpuPath::best();
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let (n, k) = (37, 96);
            let wf = Tensor::from_vec(random(n * k, 5), (n, k), &Device::Cpu)?;
            let qt = QTensor::quantize(&wf, dtype)?;
            let w = QuantWeight::from_qtensor(&qt)?
                .ok_or(candle_core::Error::Msg("unsupported".into()))?;
            for rows in [1, 3, 4, 9] {
                let x = random(rows * k, 11 + rows as u64);
                let mut want = vec![0f32; rows * n];
                product_on(CpuPath::Portable, &w, &x, rows, &mut want);
                for path in [CpuPath::Avx2, CpuPath::Vnni, CpuPath::Avx512] {
                    if path > best {
                        eprintln!("{path:?}: not on this CPU");
                        continue;
                    }
                    let mut got = vec![0f32; rows * n];
                    product_on(path, &w, &x, rows, &mut got);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{dtype:?} {rows} rows: {path:?} differs from portable"
                    );
                }
            }
        }
        Ok(())
    }

    #[test]
    fn quantizes_as_ggml_does() {
        let mut x: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) / 8.0).collect();
        // With amax 127 the inverse scale is 1: halves round to even.
        x[0] = -127.0;
        x[1] = 2.5;
        x[2] = 3.5;
        x[3] = -0.5;
        let a = quantize(&x, 1, 32, true);
        assert_eq!(&a.q[0][..4], &[-127, 2, 4, 0]);
        assert_eq!(a.d[0], f16::from_f32(1.0).to_f32());
        let sum: i32 = a.q[0].iter().map(|&q| i32::from(q)).sum();
        assert_eq!(a.s[0], f16::from_f32(sum as f32).to_f32());
    }
}

/// Speed of each instruction path on the generation family's shapes; not
/// a test of speed (no assertion on time), a measurement to run by hand:
/// `cargo test --release -p minions-engine quant_paths -- --ignored --nocapture`.
#[cfg(test)]
mod speed {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    #[ignore = "a measurement: run with --release --ignored --nocapture"]
    fn quant_paths() -> candle_core::Result<()> {
        let best = CpuPath::best();
        let paths: Vec<CpuPath> = CpuPath::ALL.into_iter().filter(|p| *p <= best).collect();
        // SmolLM2's feed-forward up projection and its output layer.
        for (n, k) in [(1536, 576), (49152, 576)] {
            let wf = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu)?;
            for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
                let qt = candle_core::quantized::QTensor::quantize(&wf, dtype)?;
                let Some(w) = QuantWeight::from_qtensor(&qt)? else {
                    continue;
                };
                for rows in [1usize, 32, 128] {
                    let x: Vec<f32> = Tensor::randn(0f32, 1.0, (rows, k), &Device::Cpu)?
                        .flatten_all()?
                        .to_vec1()?;
                    let mut out = vec![0f32; rows * n];
                    let reps = (2_000_000_000 / (rows * n * k)).clamp(2, 200);
                    // Rounds interleave the paths; the best round counts.
                    let mut best_s = vec![f64::INFINITY; paths.len()];
                    for _ in 0..5 {
                        for (i, &p) in paths.iter().enumerate() {
                            let t = std::time::Instant::now();
                            for _ in 0..reps {
                                product_on(p, &w, &x, rows, &mut out);
                            }
                            best_s[i] = best_s[i].min(t.elapsed().as_secs_f64() / reps as f64);
                        }
                    }
                    let gmac = (rows * n * k) as f64 / 1e9;
                    let line: Vec<String> = paths
                        .iter()
                        .zip(&best_s)
                        .map(|(p, s)| format!("{} {:.1} GMAC/s", p.name(), gmac / s))
                        .collect();
                    eprintln!("{dtype:?} {rows}x{k}x{n}: {}", line.join(", "));
                }
            }
        }
        Ok(())
    }
}
