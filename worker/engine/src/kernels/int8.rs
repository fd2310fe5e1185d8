//! int8 matrix product for linear layers on x86-64 CPUs, on the widest
//! instructions the CPU has ([`CpuPath`], picked at run time).
//!
//! candle's quantized matmul (ggml's Q8_0) converts and sums 32-wide blocks
//! one dot product at a time. This kernel is a tiled product instead:
//! - weights are quantised once, at load, to [-127, 127] with one scale per
//!   output column, and packed in panels of columns in the form the path's
//!   instruction multiplies;
//! - activations are quantised per row (token) to [-127, 127] with one
//!   scale each, inside the task that uses them;
//! - a micro-tile of rows × one panel keeps its 32-bit sums in registers
//!   for the whole inner dimension; sums of products of values in
//!   [-127, 127] (or [1, 255] × [-127, 127]) cannot overflow `i32` for
//!   inner sizes below 65,000;
//! - the epilogue scales back to f32 and adds the bias, then optionally
//!   applies GELU and adds a residual, in the same pass; a layer norm can
//!   follow on the task's finished rows.
//!
//! The paths ([`Kernel`]):
//! - AVX-512 VNNI: `vpdpbusd` on 512-bit registers, four byte products
//!   summed per lane, 64-column panels. The instruction multiplies unsigned
//!   by signed bytes, so the weights are stored offset by 128 (in [1, 255])
//!   and each row's sum is corrected by 128 × the sum of its values: the
//!   same integers, exactly.
//! - AVX-VNNI: the same on 256-bit registers, 16-column panels.
//! - AVX2: `vpmaddwd` on 16-bit pairs, 16-column panels.
//! - portable: the AVX2 layout's sums in plain Rust.
//!
//! Every path computes the same integer sums, so the same bits.

use std::mem::MaybeUninit;

use candle_core::Tensor;
use rayon::prelude::*;

use super::CpuPath;
use super::gelu::gelu;
use super::layer_norm::{NormParams, normalise};
use super::{fold8, round_even};

/// The op's name in errors.
const OP: &str = "int8 linear";

/// Largest quantised magnitude.
const QMAX: f32 = 127.0;
/// What the VNNI layouts add to each weight, and so the correction each
/// row's sum takes: 128 × the sum of its quantised values.
const OFFSET: i32 = 128;
/// Micro-tiles per parallel task.
const TILES_PER_TASK: usize = 8;
/// Columns of the widest panel: scales and biases are padded to it.
const MAX_NR: usize = 64;

/// Whether this CPU runs the kernel (any x86-64 CPU: the portable path
/// needs nothing; elsewhere callers use candle's quantized matmul).
pub(crate) fn available() -> bool {
    cfg!(target_arch = "x86_64")
}

/// Which micro-kernel a weight was packed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// The AVX2 layout, summed in plain Rust.
    Portable,
    /// `vpmaddwd` on 16-bit pairs.
    Avx2,
    /// `vpdpbusd` on 256-bit registers.
    AvxVnni,
    /// `vpdpbusd` on 512-bit registers.
    Avx512Vnni,
}

impl Kernel {
    /// The kernel of `path`, or the best below it that this CPU runs (a
    /// CPU may have AVX-512 VNNI and not AVX-VNNI).
    fn for_path(path: CpuPath) -> Self {
        let v3 = simd::has_v3();
        match path {
            CpuPath::Avx512 if v3 && CpuPath::has_avx512() => Self::Avx512Vnni,
            CpuPath::Avx512 | CpuPath::Vnni if v3 && CpuPath::has_avx_vnni() => Self::AvxVnni,
            CpuPath::Avx512 | CpuPath::Vnni | CpuPath::Avx2 if v3 => Self::Avx2,
            _ => Self::Portable,
        }
    }
}

/// One input group of an AVX-512 panel: four registers of 16 columns.
type Cell512 = [[u8; 64]; 4];

/// A linear layer's quantised weights, packed for one kernel. Panel `p`,
/// input group `i` at `p * groups + i`.
enum Panels {
    /// Portable and AVX2: 16 columns; for each, the values of inputs `2i`
    /// and `2i + 1` side by side (what `vpmaddwd` multiplies).
    Pairs(Vec<[[i16; 16]; 2]>),
    /// AVX-VNNI: 16 columns; for each, the values of inputs `4i..4i + 4`
    /// plus 128, as bytes (what `vpdpbusd` multiplies).
    Quads16(Vec<[[u8; 32]; 2]>),
    /// AVX-512 VNNI: as [`Panels::Quads16`], 64 columns.
    Quads64(Vec<Cell512>),
}

/// A linear layer's weight, quantised and packed for [`linear`].
pub(crate) struct Int8Weight {
    /// Inner (input) size.
    k: usize,
    /// Output size.
    n: usize,
    /// The kernel the panels are packed for.
    kernel: Kernel,
    panels: Panels,
    /// One scale per output column, padded with zeros to [`MAX_NR`].
    scale: Vec<f32>,
    /// The layer's bias, padded with zeros to [`MAX_NR`].
    bias: Vec<f32>,
}

impl Int8Weight {
    /// Quantises `w` (`(out, in)`, as checkpoints store it, f32) and keeps
    /// `b` (`out`) beside it, packed for the kernel [`CpuPath::get`] picks.
    pub(crate) fn new(w: &Tensor, b: &Tensor) -> candle_core::Result<Self> {
        Self::new_on(CpuPath::get(), w, b)
    }

    /// [`Int8Weight::new`] for the kernel of `path` (or the best below it
    /// that this CPU runs).
    pub(crate) fn new_on(path: CpuPath, w: &Tensor, b: &Tensor) -> candle_core::Result<Self> {
        let (n, k) = w.dims2()?;
        if k >= 65_000 {
            candle_core::bail!("int8 linear: inner size {k} could overflow 32-bit sums");
        }
        let w: Vec<Vec<f32>> = w.to_vec2()?;
        let mut bias: Vec<f32> = b.to_vec1()?;
        if bias.len() != n {
            candle_core::bail!("int8 linear: bias of {} for {n} outputs", bias.len());
        }
        let padded = n.div_ceil(MAX_NR) * MAX_NR;
        bias.resize(padded, 0.0);
        let mut scale = vec![0f32; padded];
        // Column-major quantised values, zero past `k`.
        let kq = k.div_ceil(4) * 4;
        let mut q = vec![0i8; n * kq];
        for (col, row) in w.iter().enumerate() {
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            scale[col] = amax / QMAX;
            let inv = if amax > 0.0 { QMAX / amax } else { 0.0 };
            for (o, &v) in q[col * kq..].iter_mut().zip(row) {
                *o = quantise(v, inv);
            }
        }
        // The value of column `c`, input `i`; zero past the last column.
        let at = |c: usize, i: usize| if c < n { q[c * kq + i] } else { 0 };
        let kernel = Kernel::for_path(path);
        let panels = match kernel {
            Kernel::Portable | Kernel::Avx2 => {
                let pairs = k.div_ceil(2);
                let mut v = Vec::with_capacity(n.div_ceil(16) * pairs);
                for p in 0..n.div_ceil(16) {
                    for i in 0..pairs {
                        v.push(std::array::from_fn(|h| {
                            std::array::from_fn(|l| {
                                i16::from(at(p * 16 + h * 8 + l / 2, 2 * i + l % 2))
                            })
                        }));
                    }
                }
                Panels::Pairs(v)
            }
            Kernel::AvxVnni => Panels::Quads16(quads::<16, 2, 32>(n, k, at)),
            Kernel::Avx512Vnni => Panels::Quads64(quads::<64, 4, 64>(n, k, at)),
        };
        Ok(Self {
            k,
            n,
            kernel,
            panels,
            scale,
            bias,
        })
    }
}

/// Panels of `NR` columns for `vpdpbusd`, `H` registers of `B` bytes each:
/// for each group of four inputs, each column's four values plus 128.
fn quads<const NR: usize, const H: usize, const B: usize>(
    n: usize,
    k: usize,
    at: impl Fn(usize, usize) -> i8,
) -> Vec<[[u8; B]; H]> {
    let groups = k.div_ceil(4);
    let mut v = Vec::with_capacity(n.div_ceil(NR) * groups);
    for p in 0..n.div_ceil(NR) {
        for i in 0..groups {
            v.push(std::array::from_fn(|h| {
                std::array::from_fn(|byte| {
                    let (c, t) = (p * NR + h * (B / 4) + byte / 4, 4 * i + byte % 4);
                    let x = if t < k { i32::from(at(c, t)) } else { 0 };
                    (x + OFFSET) as u8
                })
            }));
        }
    }
    v
}

/// `v · inv` rounded to the nearest integer (ties to even) in [-127, 127].
#[inline(always)]
fn quantise(v: f32, inv: f32) -> i8 {
    round_even((v * inv).clamp(-QMAX, QMAX)).0 as i8
}

/// The largest magnitude in `v` (NaNs skipped). Sixteen lanes, and a
/// compare-and-select rather than `f32::max`, whose NaN rule costs two
/// more instructions per register: the activations' scan is a tenth of
/// the product at these sizes.
#[inline(always)]
fn amax(v: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (chunks, tail) = v.as_chunks::<16>();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            let a = x.abs();
            *l = if a > *l { a } else { *l };
        }
    }
    let m = fold8(tail, 0.0, |m, x| m.max(x.abs()));
    lanes.iter().fold(m, |a, &b| a.max(b))
}

/// What the epilogue does after scaling back and adding the bias.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Activation {
    /// Nothing.
    None,
    /// GELU, erf form.
    Gelu,
}

/// A task's rows, quantised with one scale per row and packed in
/// micro-tiles of `MR` rows: tile `t`, input group `i` at `t * groups + i`,
/// holding for each of the tile's rows its `G` values of that group (`G` =
/// 2: two `i16` halves, low first; `G` = 4: four bytes, lowest first). Rows
/// past the last fill the last tile with zeros.
struct Rows<const MR: usize> {
    packed: Vec<[i32; MR]>,
    /// Each row's scale.
    scale: Vec<f32>,
    /// Each row's sum of quantised values (for the VNNI correction).
    sum: Vec<i32>,
}

#[inline(always)]
fn quantise_rows<const MR: usize, const G: usize>(rows: &[f32], k: usize) -> Rows<MR> {
    let groups = k.div_ceil(G);
    let m = rows.len() / k;
    let mut packed = vec![[0i32; MR]; m.div_ceil(MR) * groups];
    let mut scale = vec![0f32; m];
    let mut sum = vec![0i32; m];
    // One row's quantised values, zero past `k`.
    let mut q = vec![0i8; G * groups];
    for (r, row) in rows.chunks_exact(k).enumerate() {
        let amax = amax(row);
        scale[r] = amax / QMAX;
        let inv = if amax > 0.0 { QMAX / amax } else { 0.0 };
        let mut s = 0i32;
        for (o, &v) in q.iter_mut().zip(row) {
            *o = quantise(v, inv);
            s += i32::from(*o);
        }
        sum[r] = s;
        let (t, lane) = (r / MR, r % MR);
        for (cell, g) in packed[t * groups..(t + 1) * groups]
            .iter_mut()
            .zip(q.chunks_exact(G))
        {
            cell[lane] = if G == 2 {
                i32::from(g[0] as i16 as u16) | (i32::from(g[1]) << 16)
            } else {
                i32::from_le_bytes([g[0] as u8, g[1] as u8, g[2] as u8, g[3] as u8])
            };
        }
    }
    Rows { packed, scale, sum }
}

/// A micro-kernel: the sums of one micro-tile of `MR` packed rows with one
/// panel of `NR` columns.
trait Tile<const MR: usize, const NR: usize>: Copy {
    /// One group of inputs of a panel.
    type Cell;
    /// Values per input group (2 or 4).
    const G: usize;
    /// `MR × NR` integer sums (VNNI: before the row correction).
    fn tile(self, rows: &[[i32; MR]], panel: &[Self::Cell]) -> [[i32; NR]; MR];
}

/// The portable micro-kernel over the AVX2 layout.
#[derive(Clone, Copy)]
struct Plain;

impl<const MR: usize> Tile<MR, 16> for Plain {
    type Cell = [[i16; 16]; 2];
    const G: usize = 2;

    #[inline(always)]
    fn tile(self, rows: &[[i32; MR]], panel: &[Self::Cell]) -> [[i32; 16]; MR] {
        let mut acc = [[0i32; 16]; MR];
        for (cell, rows) in panel.iter().zip(rows) {
            for (acc, &row) in acc.iter_mut().zip(rows) {
                let (lo, hi) = (row << 16 >> 16, row >> 16);
                for (j, a) in acc.iter_mut().enumerate() {
                    let w = &cell[j / 8][(j % 8) * 2..];
                    *a += lo * i32::from(w[0]) + hi * i32::from(w[1]);
                }
            }
        }
        acc
    }
}

/// The VNNI layouts' sums in plain Rust: where a weight packed for a VNNI
/// kernel meets a CPU without it (never, as [`Kernel::for_path`] packs).
#[derive(Clone, Copy)]
struct PlainQuads;

/// `MR × NR` sums of quad-packed rows with a panel of `H` registers of `B`
/// bytes (`NR = H · B / 4`), before the row correction.
#[inline(always)]
fn plain_quads<const MR: usize, const NR: usize, const H: usize, const B: usize>(
    rows: &[[i32; MR]],
    panel: &[[[u8; B]; H]],
) -> [[i32; NR]; MR] {
    let mut acc = [[0i32; NR]; MR];
    for (cell, rows) in panel.iter().zip(rows) {
        for (acc, &row) in acc.iter_mut().zip(rows) {
            let a = row.to_le_bytes();
            for (j, s) in acc.iter_mut().enumerate() {
                let w = &cell[j / (B / 4)][(j % (B / 4)) * 4..];
                for t in 0..4 {
                    *s += i32::from(w[t]) * i32::from(a[t] as i8);
                }
            }
        }
    }
    acc
}

impl<const MR: usize> Tile<MR, 16> for PlainQuads {
    type Cell = [[u8; 32]; 2];
    const G: usize = 4;

    #[inline(always)]
    fn tile(self, rows: &[[i32; MR]], panel: &[Self::Cell]) -> [[i32; 16]; MR] {
        plain_quads(rows, panel)
    }
}

impl<const MR: usize> Tile<MR, 64> for PlainQuads {
    type Cell = Cell512;
    const G: usize = 4;

    #[inline(always)]
    fn tile(self, rows: &[[i32; MR]], panel: &[Self::Cell]) -> [[i32; 64]; MR] {
        plain_quads(rows, panel)
    }
}

/// Runs one task's rows: quantise them, then every panel × micro-tile,
/// then the layer norm.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn task<const MR: usize, const NR: usize, T: Tile<MR, NR>>(
    tile: T,
    w: &Int8Weight,
    panels: &[T::Cell],
    x: &[f32],
    residual: Option<&[f32]>,
    act: Activation,
    norm: Option<&NormParams>,
    out: &mut [MaybeUninit<f32>],
) {
    let groups = w.k.div_ceil(T::G);
    let rows = if T::G == 2 {
        quantise_rows::<MR, 2>(x, w.k)
    } else {
        quantise_rows::<MR, 4>(x, w.k)
    };
    let offset = if T::G == 4 { OFFSET } else { 0 };
    let m = rows.scale.len();
    let (scales, _) = w.scale.as_chunks::<NR>();
    let (biases, _) = w.bias.as_chunks::<NR>();
    for (p, ((panel, sw), b)) in panels
        .chunks_exact(groups)
        .zip(scales)
        .zip(biases)
        .enumerate()
    {
        let c0 = p * NR;
        let width = NR.min(w.n - c0);
        for (t, packed) in rows.packed.chunks_exact(groups).enumerate() {
            let r0 = t * MR;
            let sums = tile.tile(packed, panel);
            for (i, s) in sums.iter().take(m - r0).enumerate() {
                let r = r0 + i;
                let e = Epilogue {
                    corr: offset * rows.sum[r],
                    sx: rows.scale[r],
                    sw,
                    b,
                };
                let at = r * w.n + c0;
                let res = residual.map(|res| &res[at..at + width]);
                let o = &mut out[at..at + width];
                match act {
                    Activation::None => e.store(s, |v| v, res, o),
                    Activation::Gelu => e.store(s, gelu, res, o),
                }
            }
        }
    }
    // The task's rows are whole now, and still in cache.
    if let Some(norm) = norm {
        // SAFETY: the loops above wrote every value of `out`: its `m`
        // rows, each panel's columns of each (the panels cover all `n`),
        // and `out` holds `m × n` values. `MaybeUninit<f32>` has the
        // layout of `f32`.
        #[allow(unsafe_code)]
        let out = unsafe { &mut *(std::ptr::from_mut(out) as *mut [f32]) };
        for row in out.chunks_exact_mut(w.n) {
            normalise(row, norm);
        }
    }
}

/// A tile row's scaling back: `(s[j] - corr) · (sx · sw[j]) + b[j]`.
struct Epilogue<'a, const NR: usize> {
    /// The row's VNNI correction (zero on the other layouts).
    corr: i32,
    /// The row's scale.
    sx: f32,
    /// The panel's columns' scales.
    sw: &'a [f32; NR],
    /// The panel's columns' biases.
    b: &'a [f32; NR],
}

impl<const NR: usize> Epilogue<'_, NR> {
    /// `o[j] = act(value j) (+ res[j])` for the row's columns of this
    /// panel (all of them, or fewer in the last panel), each written once,
    /// in one loop: the output starts uninitialised, and no row is built
    /// on the stack first (its copy out was a call to `memcpy` per row).
    #[inline(always)]
    fn store(
        &self,
        s: &[i32; NR],
        act: impl Fn(f32) -> f32,
        res: Option<&[f32]>,
        o: &mut [MaybeUninit<f32>],
    ) {
        let value = |j: usize, s: i32| (s - self.corr) as f32 * (self.sx * self.sw[j]) + self.b[j];
        if let Ok(o) = <&mut [MaybeUninit<f32>; NR]>::try_from(&mut *o) {
            match res.map(<&[f32; NR]>::try_from) {
                Some(Ok(res)) => {
                    for (j, ((o, &s), &r)) in o.iter_mut().zip(s).zip(res).enumerate() {
                        o.write(act(value(j, s)) + r);
                    }
                }
                _ => {
                    for (j, (o, &s)) in o.iter_mut().zip(s).enumerate() {
                        o.write(act(value(j, s)));
                    }
                }
            }
            return;
        }
        match res {
            Some(res) => {
                for (j, ((o, &s), &r)) in o.iter_mut().zip(s).zip(res).enumerate() {
                    o.write(act(value(j, s)) + r);
                }
            }
            None => {
                for (j, (o, &s)) in o.iter_mut().zip(s).enumerate() {
                    o.write(act(value(j, s)));
                }
            }
        }
    }
}

/// One task's arguments: its input rows, residual and output rows.
struct TaskArgs<'a> {
    w: &'a Int8Weight,
    x: &'a [f32],
    residual: Option<&'a [f32]>,
    act: Activation,
    norm: Option<&'a NormParams>,
    out: &'a mut [MaybeUninit<f32>],
}

/// Rows per micro-tile of `kernel`.
fn tile_rows(kernel: Kernel) -> usize {
    match kernel {
        Kernel::Portable | Kernel::Avx2 | Kernel::AvxVnni => 6,
        Kernel::Avx512Vnni => simd::MR512,
    }
}

/// Runs one task on the weight's kernel.
fn run_task(a: TaskArgs<'_>) {
    match &a.w.panels {
        Panels::Pairs(p) if a.w.kernel == Kernel::Avx2 => simd::task_avx2(a, p),
        Panels::Pairs(p) => task::<6, 16, _>(Plain, a.w, p, a.x, a.residual, a.act, a.norm, a.out),
        Panels::Quads16(p) => simd::task_avx_vnni(a, p),
        Panels::Quads64(p) => simd::task_avx512(a, p),
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
    // Sizes checked by `linear_op::linear`.
    let m = x.len() / w.k;
    let rows_per_task = TILES_PER_TASK * tile_rows(w.kernel);
    let mut out = Vec::new();
    written(&mut out, m * w.n, |out| {
        out.par_chunks_mut(rows_per_task * w.n)
            .zip(x.par_chunks(rows_per_task * w.k))
            .enumerate()
            .for_each(|(t, (out, x))| {
                let at = t * rows_per_task * w.n;
                let residual = residual.map(|r| &r[at..at + out.len()]);
                run_task(TaskArgs {
                    w,
                    x,
                    residual,
                    act,
                    norm,
                    out,
                });
            });
    });
    Ok(out)
}

/// Fills `v` with `len` values written by `tasks` into its spare
/// capacity, none zeroed first (a pass over tens of megabytes). Only for
/// `tasks` that hand every value to [`run_task`]s, which write each value
/// of their output (`task`: every row, every panel's columns).
fn written(v: &mut Vec<f32>, len: usize, tasks: impl FnOnce(&mut [MaybeUninit<f32>])) {
    v.clear();
    v.reserve(len);
    tasks(&mut v.spare_capacity_mut()[..len]);
    // SAFETY: `tasks` wrote every one of the first `len` values (the
    // contract above; every caller splits them among run_task calls).
    #[allow(unsafe_code)]
    unsafe {
        v.set_len(len);
    }
}

/// The feed-forward block on rows of `x`: `norm(x + down(gelu(up(x))))`.
/// Each task runs both products on its rows back to back, so its
/// intermediate rows (`rows × up.n`, a few hundred KB) stay in the core's
/// cache; as two layers they went out to memory, tens of MB per pass, and
/// were read back. The same tasks and the same operations, so the same
/// bits. Sizes checked by the caller: `up` is `k → m`, `down` `m → k`, on
/// one kernel.
pub(super) fn run_ffn(
    up: &Int8Weight,
    down: &Int8Weight,
    x: &[f32],
    norm: Option<&NormParams>,
) -> Vec<f32> {
    let m = x.len() / up.k;
    let rows_per_task = TILES_PER_TASK * tile_rows(up.kernel);
    let mut out = Vec::new();
    written(&mut out, m * down.n, |out| {
        out.par_chunks_mut(rows_per_task * down.n)
            .zip(x.par_chunks(rows_per_task * up.k))
            .for_each_init(Vec::new, |mid: &mut Vec<f32>, (out, x)| {
                written(mid, x.len() / up.k * up.n, |mid| {
                    run_task(TaskArgs {
                        w: up,
                        x,
                        residual: None,
                        act: Activation::Gelu,
                        norm: None,
                        out: mid,
                    });
                });
                super::fault::apply(mid, up.n);
                run_task(TaskArgs {
                    w: down,
                    x: mid,
                    residual: Some(x),
                    act: Activation::None,
                    norm,
                    out,
                });
            });
    });
    out
}

/// Whether `up` then `down` make a feed-forward block [`run_ffn`] runs:
/// `k → m → k`, packed for one kernel.
pub(super) fn ffn_fits(up: &Int8Weight, down: &Int8Weight) -> bool {
    up.n == down.k && down.n == up.k && up.kernel == down.kernel
}

/// Inner (input) size of `w`.
pub(super) fn inner(w: &Int8Weight) -> usize {
    w.k
}

impl super::linear_op::LinearKernel for Int8Weight {
    const OP: &'static str = OP;

    fn k(&self) -> usize {
        self.k
    }

    fn n(&self) -> usize {
        self.n
    }

    fn run(
        &self,
        x: &[f32],
        residual: Option<&[f32]>,
        act: Activation,
        norm: Option<&NormParams>,
    ) -> candle_core::Result<Vec<f32>> {
        run(self, x, residual, act, norm)
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
    super::linear_op::linear(w, x, act, residual, norm)
}

/// The x86-64 micro-kernels. Each path's task is compiled for its
/// instructions, so its quantising, epilogue and layer norm are too.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{Cell512, Int8Weight, MaybeUninit, PlainQuads, TaskArgs, Tile, task};
    use pulp::bytemuck::cast;
    use pulp::x86::V3;
    use std::arch::x86_64::{
        __m256i, __m512i, _mm256_dpbusd_avx_epi32, _mm256_set1_epi32, _mm256_setzero_si256,
        _mm512_dpbusd_epi32, _mm512_set1_epi32, _mm512_setzero_si512,
    };

    /// Rows per AVX-512 micro-tile: 4 × 6 accumulators of the 32
    /// registers, with the panel's four and a broadcast beside them (each
    /// broadcast feeds four products).
    pub(super) const MR512: usize = 6;

    /// Whether the CPU has x86-64-v3 (AVX2, FMA, …).
    pub(super) fn has_v3() -> bool {
        V3::try_new().is_some()
    }

    /// `vpmaddwd` on 16-bit pairs; holds proof of AVX2.
    #[derive(Clone, Copy)]
    struct Avx2(V3);

    impl<const MR: usize> Tile<MR, 16> for Avx2 {
        type Cell = [[i16; 16]; 2];
        const G: usize = 2;

        #[inline(always)]
        fn tile(self, rows: &[[i32; MR]], panel: &[Self::Cell]) -> [[i32; 16]; MR] {
            let v3 = self.0;
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
            std::array::from_fn(|r| cast(acc[r]))
        }
    }

    /// `vpdpbusd` on 256-bit registers; constructed only inside
    /// [`task_avx_vnni_body`], which runs only where the CPU has AVX-VNNI.
    #[derive(Clone, Copy)]
    struct AvxVnni;

    impl<const MR: usize> Tile<MR, 16> for AvxVnni {
        type Cell = [[u8; 32]; 2];
        const G: usize = 4;

        #[inline(always)]
        fn tile(self, rows: &[[i32; MR]], panel: &[Self::Cell]) -> [[i32; 16]; MR] {
            // SAFETY: an `AvxVnni` exists only inside
            // `task_avx_vnni_body`, entered only where the CPU reported
            // AVX2 and AVX-VNNI; the function has no other precondition.
            #[allow(unsafe_code)]
            unsafe {
                tile_avx_vnni(rows, panel)
            }
        }
    }

    #[target_feature(enable = "avx,avx2,avxvnni")]
    #[inline]
    fn tile_avx_vnni<const MR: usize>(
        rows: &[[i32; MR]],
        panel: &[[[u8; 32]; 2]],
    ) -> [[i32; 16]; MR] {
        let mut acc = [[_mm256_setzero_si256(); 2]; MR];
        for (cell, rows) in panel.iter().zip(rows) {
            let w0: __m256i = cast(cell[0]);
            let w1: __m256i = cast(cell[1]);
            for (acc, &row) in acc.iter_mut().zip(rows) {
                let a = _mm256_set1_epi32(row);
                acc[0] = _mm256_dpbusd_avx_epi32(acc[0], w0, a);
                acc[1] = _mm256_dpbusd_avx_epi32(acc[1], w1, a);
            }
        }
        std::array::from_fn(|r| cast(acc[r]))
    }

    /// `vpdpbusd` on 512-bit registers; constructed only inside
    /// [`task_avx512_body`], which runs only where the CPU has AVX-512 F,
    /// BW and VNNI.
    #[derive(Clone, Copy)]
    struct Avx512Vnni;

    impl<const MR: usize> Tile<MR, 64> for Avx512Vnni {
        type Cell = Cell512;
        const G: usize = 4;

        #[inline(always)]
        fn tile(self, rows: &[[i32; MR]], panel: &[Self::Cell]) -> [[i32; 64]; MR] {
            // SAFETY: an `Avx512Vnni` exists only inside
            // `task_avx512_body`, entered only where the CPU reported
            // AVX-512 F, BW and VNNI; the function has no other
            // precondition.
            #[allow(unsafe_code)]
            unsafe {
                tile_avx512(rows, panel)
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    fn tile_avx512<const MR: usize>(rows: &[[i32; MR]], panel: &[Cell512]) -> [[i32; 64]; MR] {
        let mut acc = [[_mm512_setzero_si512(); 4]; MR];
        for (cell, rows) in panel.iter().zip(rows) {
            let w: [__m512i; 4] = cell.map(cast);
            for (acc, &row) in acc.iter_mut().zip(rows) {
                let a = _mm512_set1_epi32(row);
                for (acc, &w) in acc.iter_mut().zip(&w) {
                    *acc = _mm512_dpbusd_epi32(*acc, w, a);
                }
            }
        }
        // Register by register: `map` copied the sums through `memcpy`.
        std::array::from_fn(|r| cast(acc[r]))
    }

    /// The AVX2 task, compiled for x86-64-v3.
    pub(super) fn task_avx2(a: TaskArgs<'_>, panels: &[[[i16; 16]; 2]]) {
        match V3::try_new() {
            Some(v3) => v3.vectorize(
                #[inline(always)]
                || task::<6, 16, _>(Avx2(v3), a.w, panels, a.x, a.residual, a.act, a.norm, a.out),
            ),
            // Packed for AVX2 only where the CPU has it.
            None => task::<6, 16, _>(
                super::Plain,
                a.w,
                panels,
                a.x,
                a.residual,
                a.act,
                a.norm,
                a.out,
            ),
        }
    }

    /// The AVX-VNNI task.
    pub(super) fn task_avx_vnni(a: TaskArgs<'_>, panels: &[[[u8; 32]; 2]]) {
        if has_v3() && crate::CpuPath::has_avx_vnni() {
            // SAFETY: the CPU reported AVX2, FMA and AVX-VNNI, every
            // feature the function is compiled for.
            #[allow(unsafe_code)]
            unsafe {
                task_avx_vnni_body(a.w, panels, a.x, a.residual, a.act, a.norm, a.out)
            }
        } else {
            task::<6, 16, _>(
                PlainQuads, a.w, panels, a.x, a.residual, a.act, a.norm, a.out,
            );
        }
    }

    #[target_feature(enable = "avx,avx2,fma,avxvnni")]
    fn task_avx_vnni_body(
        w: &Int8Weight,
        panels: &[[[u8; 32]; 2]],
        x: &[f32],
        residual: Option<&[f32]>,
        act: super::Activation,
        norm: Option<&super::NormParams>,
        out: &mut [MaybeUninit<f32>],
    ) {
        task::<6, 16, _>(AvxVnni, w, panels, x, residual, act, norm, out);
    }

    /// The AVX-512 task.
    pub(super) fn task_avx512(a: TaskArgs<'_>, panels: &[Cell512]) {
        if has_v3() && crate::CpuPath::has_avx512() {
            // SAFETY: the CPU reported AVX2, FMA and AVX-512 F, BW, VL
            // and VNNI, every feature the function is compiled for.
            #[allow(unsafe_code)]
            unsafe {
                task_avx512_body(a.w, panels, a.x, a.residual, a.act, a.norm, a.out)
            }
        } else {
            task::<MR512, 64, _>(
                PlainQuads, a.w, panels, a.x, a.residual, a.act, a.norm, a.out,
            );
        }
    }

    #[target_feature(enable = "avx,avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn task_avx512_body(
        w: &Int8Weight,
        panels: &[Cell512],
        x: &[f32],
        residual: Option<&[f32]>,
        act: super::Activation,
        norm: Option<&super::NormParams>,
        out: &mut [MaybeUninit<f32>],
    ) {
        task::<MR512, 64, _>(Avx512Vnni, w, panels, x, residual, act, norm, out);
    }
}

/// Off x86-64 only the portable kernel exists (and callers use candle's
/// quantized matmul, [`available`]).
#[cfg(not(target_arch = "x86_64"))]
mod simd {
    use super::{Cell512, Plain, PlainQuads, TaskArgs, task};

    /// Unused off x86-64.
    pub(super) const MR512: usize = 6;

    pub(super) fn has_v3() -> bool {
        false
    }

    pub(super) fn task_avx2(a: TaskArgs<'_>, panels: &[[[i16; 16]; 2]]) {
        task::<6, 16, _>(Plain, a.w, panels, a.x, a.residual, a.act, a.norm, a.out);
    }

    pub(super) fn task_avx_vnni(a: TaskArgs<'_>, panels: &[[[u8; 32]; 2]]) {
        task::<6, 16, _>(
            PlainQuads, a.w, panels, a.x, a.residual, a.act, a.norm, a.out,
        );
    }

    pub(super) fn task_avx512(a: TaskArgs<'_>, panels: &[Cell512]) {
        task::<MR512, 64, _>(
            PlainQuads, a.w, panels, a.x, a.residual, a.act, a.norm, a.out,
        );
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

    /// The kernel's exact integer arithmetic, written plainly, over a
    /// weight packed for the portable kernel.
    fn reference(w: &Int8Weight, x: &[f32], act: Activation, res: Option<&[f32]>) -> Vec<f32> {
        let Panels::Pairs(panels) = &w.panels else {
            panic!("the reference reads the pairs layout");
        };
        let pairs = w.k.div_ceil(2);
        let rows = quantise_rows::<6, 2>(x, w.k);
        let m = rows.scale.len();
        let mut out = vec![0f32; m * w.n];
        for r in 0..m {
            let a = &rows.packed[(r / 6) * pairs..(r / 6 + 1) * pairs];
            for c in 0..w.n {
                let (p, j) = (c / 16, c % 16);
                let mut s = 0i32;
                for (i, pair) in a.iter().enumerate() {
                    let pair = pair[r % 6];
                    let cell = &panels[p * pairs + i][j / 8];
                    let (lo, hi) = (pair << 16 >> 16, pair >> 16);
                    s += lo * i32::from(cell[(j % 8) * 2]) + hi * i32::from(cell[(j % 8) * 2 + 1]);
                }
                let at = r * w.n + c;
                let mut v = s as f32 * (rows.scale[r] * w.scale[c]) + w.bias[c];
                if act == Activation::Gelu {
                    v = gelu(v);
                }
                out[at] = v + res.map_or(0.0, |res| res[at]);
            }
        }
        out
    }

    /// The paths this CPU runs, from the portable one up.
    fn paths() -> Vec<CpuPath> {
        CpuPath::ALL
            .into_iter()
            .filter(|p| *p <= CpuPath::best())
            .collect()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
    }

    /// The feed-forward block as one op gives the two layers' bits, on
    /// every path, at rows off the tile and task; sizes that do not chain
    /// are refused.
    #[test]
    fn the_fused_feed_forward_block_gives_the_two_layers_bits() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let (k, mid) = (45, 103);
        let up_w = Tensor::from_vec(values(mid * k, 7), (mid, k), &dev)?;
        let up_b = Tensor::from_vec(values(mid, 8), mid, &dev)?;
        let down_w = Tensor::from_vec(values(k * mid, 9), (k, mid), &dev)?;
        let down_b = Tensor::from_vec(values(k, 10), k, &dev)?;
        let p = NormParams::new(values(k, 5), values(k, 6), 1e-12)?;
        for path in paths() {
            let up = Int8Weight::new_on(path, &up_w, &up_b)?;
            let down = Int8Weight::new_on(path, &down_w, &down_b)?;
            for m in [1, 7, 61, 113] {
                let x = Tensor::from_vec(values(m * k, 3), (m, k), &dev)?;
                let h = linear(&up, &x, Activation::Gelu, None, None)?;
                let want = linear(&down, &h, Activation::None, Some(&x), Some(&p))?;
                let ours = super::super::int8_ffn(&up, &down, &x, &p)?;
                let (ours, want) = (
                    ours.flatten_all()?.to_vec1()?,
                    want.flatten_all()?.to_vec1()?,
                );
                assert_eq!(max_diff(&ours, &want), 0.0, "{path:?}, {m} rows");
            }
            let x = Tensor::from_vec(values(3 * k, 3), (3, k), &dev)?;
            let err = super::super::int8_ffn(&up, &up, &x, &p)
                .err()
                .map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains("do not chain")),
                "{err:?}"
            );
        }
        Ok(())
    }

    /// Odd sizes (rows off the tile, columns off the panel, an inner size
    /// off the input group): every path this CPU runs, forced in turn,
    /// gives the plain integer arithmetic's bits.
    #[test]
    fn every_cpu_path_matches_plain_arithmetic() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let (k, n) = (45, 37);
        let w = Tensor::from_vec(values(n * k, 1), (n, k), &dev)?;
        let b = Tensor::from_vec(values(n, 2), n, &dev)?;
        let plain = Int8Weight::new_on(CpuPath::Portable, &w, &b)?;
        for path in paths() {
            let q = Int8Weight::new_on(path, &w, &b)?;
            eprintln!("{path:?}: {:?}", q.kernel);
            for m in [1, 5, 13, 61, 200] {
                let x = Tensor::from_vec(values(m * k, 3), (m, k), &dev)?;
                let r = Tensor::from_vec(values(m * n, 4), (m, n), &dev)?;
                let xs = values(m * k, 3);
                let rs = values(m * n, 4);
                for act in [Activation::None, Activation::Gelu] {
                    let ours = linear(&q, &x, act, None, None)?
                        .flatten_all()?
                        .to_vec1::<f32>()?;
                    let want = reference(&plain, &xs, act, None);
                    assert_eq!(max_diff(&ours, &want), 0.0, "{path:?}, {m} rows");
                    let ours = linear(&q, &x, act, Some(&r), None)?
                        .flatten_all()?
                        .to_vec1::<f32>()?;
                    let want = reference(&plain, &xs, act, Some(&rs));
                    assert_eq!(max_diff(&ours, &want), 0.0, "{path:?}, {m} rows");
                }
                // With the layer norm fused: the same as normalising afterwards.
                let p = NormParams::new(values(n, 5), values(n, 6), 1e-12)?;
                let ours = linear(&q, &x, Activation::None, Some(&r), Some(&p))?;
                let mut theirs = reference(&plain, &xs, Activation::None, Some(&rs));
                for row in theirs.chunks_exact_mut(n) {
                    normalise(row, &p);
                }
                assert_eq!(max_diff(&ours.flatten_all()?.to_vec1()?, &theirs), 0.0);
            }
        }
        // The best path packs for the best kernel this CPU has.
        let best = Int8Weight::new_on(CpuPath::best(), &w, &b)?.kernel;
        if CpuPath::has_avx512() {
            assert_eq!(best, Kernel::Avx512Vnni);
        }
        let x = Tensor::from_vec(values(3 * k, 3), (3, k), &dev)?;
        let wrong = NormParams::new(vec![1.0; n + 1], vec![0.0; n + 1], 1e-12)?;
        let err = linear(&plain, &x, Activation::None, None, Some(&wrong)).err();
        assert!(err.is_some_and(|e| e.to_string().contains("layer norm of 38 after 37")));
        Ok(())
    }

    /// Against the f32 product: errors of the size int8 rounding makes.
    #[test]
    fn close_to_the_f32_product() -> candle_core::Result<()> {
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
            let mut f = x.matmul(&wt)?;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                f = x.matmul(&wt)?;
            }
            let tf = t.elapsed().as_secs_f64() / f64::from(reps);
            let gmac = (m * k * n) as f64 / 1e9;
            let mut line = format!("{m}x{k}x{n}: f32 {:.1} GMAC/s", gmac / tf);
            for path in CpuPath::ALL.into_iter().filter(|p| *p <= CpuPath::best()) {
                let q = Int8Weight::new_on(path, &w, &b)?;
                let mut i = linear(&q, &x, Activation::None, None, None)?;
                let reps = if path == CpuPath::Portable { 2 } else { reps };
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    i = linear(&q, &x, Activation::None, None, None)?;
                }
                let ti = t.elapsed().as_secs_f64() / f64::from(reps);
                let err = (&f - &i)?.sqr()?.mean_all()?.sqrt()?.to_scalar::<f32>()?;
                let rms = f.sqr()?.mean_all()?.sqrt()?.to_scalar::<f32>()?;
                assert!(err < 0.02 * rms, "rms error {err} against rms {rms}");
                line += &format!(", int8 {} {:.1} GMAC/s", path.name(), gmac / ti);
            }
            eprintln!("{line}");
        }
        Ok(())
    }
}
