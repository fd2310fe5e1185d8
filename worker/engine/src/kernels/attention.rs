//! Self-attention over packed sequences: each text attends to its own
//! tokens only, with no padding and no mask.
//!
//! The padded form (candle's ops) scatters the packed states into a
//! `(batch, len)` layout, permutes query, key and value into heads, builds
//! one `(batch, heads, len, len)` score tensor, and gathers the result back:
//! several copies and large fresh allocations per layer, whose page faults
//! cost more than the arithmetic. Here one task per text reads its rows of
//! the packed `(tokens, 3·hidden)` product directly, head by head, through
//! scratch buffers of its own size, and writes its rows of the
//! `(tokens, hidden)` result. A text's output then depends on its tokens
//! alone, not on the other texts of its batch.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::contiguous_f32;
use super::lanes::{Lanes, Plain};
use super::softmax::softmax_in_place;

/// The op's name in errors.
const OP: &str = "packed attention";
/// Rows per micro-tile.
const ROWS: usize = 4;
/// Columns per micro-tile: two eight-lane registers.
const COLS: usize = 16;
/// A micro-tile's row of columns.
type Block = [f32; COLS];

/// The shape every task shares.
struct Dims {
    /// Hidden size: query, key and value each take this many columns.
    hidden: usize,
    /// Columns per head.
    head_dim: usize,
    heads: usize,
}

/// One text's queries, keys and values, copied out of the packed product
/// in one pass into the layouts the micro-tiles read in order, head after
/// head, and one row tile's probabilities. Padding (rows past the text,
/// columns past the head) is zero: the load writes real rows and columns
/// only.
struct Scratch {
    /// Query tiles: head `h`, tile `t`, column `c` at `(h·tiles + t)·hd +
    /// c`, holding that column for the tile's [`ROWS`] rows.
    q: Vec<[f32; ROWS]>,
    /// Key blocks: head `h`, block `b`, column `c` at `(h·blocks + b)·hd +
    /// c`, holding that column for the block's [`COLS`] keys.
    k: Vec<Block>,
    /// Value blocks: head `h`, column block `b`, token `j` at
    /// `(h·vblocks + b)·n + j`.
    v: Vec<Block>,
    /// One row tile's scores, then probabilities: [`ROWS`] rows of `nc`.
    p: Vec<f32>,
    /// The same probabilities by token: token `j` at `j`, one per row.
    pt: Vec<[f32; ROWS]>,
    /// Tokens.
    n: usize,
    /// Tokens rounded up to whole key blocks.
    nc: usize,
    /// Columns per head.
    hd: usize,
    /// Query tiles per head.
    tiles: usize,
    /// Key blocks per head.
    blocks: usize,
    /// Value column blocks per head.
    vblocks: usize,
}

impl Scratch {
    fn new(n: usize, hd: usize, heads: usize) -> Self {
        let nc = n.next_multiple_of(COLS);
        let (tiles, blocks, vblocks) = (n.div_ceil(ROWS), nc / COLS, hd.div_ceil(COLS));
        Self {
            q: vec![[0.0; ROWS]; heads * tiles * hd],
            k: vec![[0.0; COLS]; heads * blocks * hd],
            v: vec![[0.0; COLS]; heads * vblocks * n],
            p: vec![0.0; ROWS * nc],
            pt: vec![[0.0; ROWS]; n],
            n,
            nc,
            hd,
            tiles,
            blocks,
            vblocks,
        }
    }

    /// Where query tile `t` of head `h` starts in `q`.
    fn q_at(&self, h: usize, t: usize) -> usize {
        (h * self.tiles + t) * self.hd
    }

    /// Where key block `b` of head `h` starts in `k`.
    fn k_at(&self, h: usize, b: usize) -> usize {
        (h * self.blocks + b) * self.hd
    }

    /// Where value column block `b` of head `h` starts in `v`.
    fn v_at(&self, h: usize, b: usize) -> usize {
        (h * self.vblocks + b) * self.n
    }

    /// Copies the text's rows `qkv` (`(n, 3·hidden)`) in, row by row.
    #[inline(always)]
    fn load(&mut self, d: &Dims, qkv: &[f32]) {
        let hd = self.hd;
        for (i, row) in qkv.chunks_exact(3 * d.hidden).enumerate() {
            let (qs, rest) = row.split_at(d.hidden);
            let (ks, vs) = rest.split_at(d.hidden);
            let (t, r) = (i / ROWS, i % ROWS);
            let (b, l) = (i / COLS, i % COLS);
            for (h, ((q, k), v)) in qs
                .chunks_exact(hd)
                .zip(ks.chunks_exact(hd))
                .zip(vs.chunks_exact(hd))
                .enumerate()
            {
                let at = self.q_at(h, t);
                for (cell, &q) in self.q[at..at + hd].iter_mut().zip(q) {
                    cell[r] = q;
                }
                let at = self.k_at(h, b);
                for (cell, &k) in self.k[at..at + hd].iter_mut().zip(k) {
                    cell[l] = k;
                }
                for (vb, v) in v.chunks(COLS).enumerate() {
                    let at = self.v_at(h, vb) + i;
                    let cell = &mut self.v[at];
                    match <&Block>::try_from(v) {
                        Ok(v) => *cell = *v,
                        Err(_) => cell[..v.len()].copy_from_slice(v),
                    }
                }
            }
        }
    }

    /// Probabilities of head `h`, row tile `t`: scores `q · kᵀ` (the scale
    /// is in the query), softmax per row, then transposed into `pt`.
    #[inline(always)]
    fn probabilities<S: Lanes>(&mut self, s: S, h: usize, t: usize) {
        let (n, nc, hd) = (self.n, self.nc, self.hd);
        let q = &self.q[self.q_at(h, t)..self.q_at(h, t + 1)];
        for (b, k) in self.k[self.k_at(h, 0)..self.k_at(h + 1, 0)]
            .chunks_exact(hd)
            .enumerate()
        {
            let mut acc = [[s.zero(); 2]; ROWS];
            for (k, q) in k.iter().zip(q) {
                let k = split(s, k);
                for (acc, &q) in acc.iter_mut().zip(q) {
                    let q = s.splat(q);
                    acc[0] = s.mul_add(q, k[0], acc[0]);
                    acc[1] = s.mul_add(q, k[1], acc[1]);
                }
            }
            for (row, acc) in self.p.chunks_exact_mut(nc).zip(&acc) {
                // Rows are whole blocks long.
                row.as_chunks_mut::<COLS>().0[b] = join(s, acc);
            }
        }
        let rows = ROWS.min(n - t * ROWS);
        for row in self.p.chunks_exact_mut(nc).take(rows) {
            softmax_in_place(&mut row[..n]);
        }
        for (r, row) in self.p.chunks_exact(nc).enumerate() {
            for (cell, &p) in self.pt.iter_mut().zip(row) {
                cell[r] = p;
            }
        }
    }

    /// `p · v` for row tile `t` of head `h`, into the text's rows `out`
    /// (`(n, hidden)`).
    #[inline(always)]
    fn context<S: Lanes>(&self, s: S, d: &Dims, t: usize, h: usize, out: &mut [f32]) {
        let (n, hd) = (self.n, self.hd);
        let rows = ROWS.min(n - t * ROWS);
        for (b, v) in self.v[self.v_at(h, 0)..self.v_at(h + 1, 0)]
            .chunks_exact(n)
            .enumerate()
        {
            let mut acc = [[s.zero(); 2]; ROWS];
            for (v, p) in v.iter().zip(&self.pt) {
                let v = split(s, v);
                for (acc, &p) in acc.iter_mut().zip(p) {
                    let p = s.splat(p);
                    acc[0] = s.mul_add(p, v[0], acc[0]);
                    acc[1] = s.mul_add(p, v[1], acc[1]);
                }
            }
            let c0 = b * COLS;
            let cols = COLS.min(hd - c0);
            for (r, acc) in acc.iter().enumerate().take(rows) {
                let at = (t * ROWS + r) * d.hidden + h * hd + c0;
                let block = join(s, acc);
                match <&mut Block>::try_from(&mut out[at..at + cols]) {
                    Ok(o) => *o = block,
                    Err(_) => out[at..at + cols].copy_from_slice(&block[..cols]),
                }
            }
        }
    }
}

/// A block as two registers.
#[inline(always)]
fn split<S: Lanes>(s: S, b: &Block) -> [S::V; 2] {
    let [lo, hi]: [[f32; 8]; 2] = pulp::cast(*b);
    [s.load(lo), s.load(hi)]
}

/// Two registers as a block.
#[inline(always)]
fn join<S: Lanes>(s: S, v: &[S::V; 2]) -> Block {
    pulp::cast([s.store(v[0]), s.store(v[1])])
}

/// Attention for one text: `qkv` its rows of the product, `out` its rows
/// of the result.
#[inline(always)]
fn text<S: Lanes>(s: S, d: &Dims, qkv: &[f32], out: &mut [f32]) {
    let n = qkv.len() / (3 * d.hidden);
    if n == 0 || d.head_dim == 0 {
        return;
    }
    let mut scratch = Scratch::new(n, d.head_dim, d.heads);
    scratch.load(d, qkv);
    for h in 0..d.heads {
        for t in 0..scratch.tiles {
            scratch.probabilities(s, h, t);
            scratch.context(s, d, t, h, out);
        }
    }
}

/// [`text`] compiled for the instruction set of `S`.
#[inline(always)]
fn run<S: Lanes>(s: S, d: &Dims, qkv: &[f32], out: &mut [f32]) {
    struct Task<'a, 'b, S> {
        s: S,
        d: &'a Dims,
        qkv: &'a [f32],
        out: &'b mut [f32],
    }
    impl<S: Lanes> pulp::NullaryFnOnce for Task<'_, '_, S> {
        type Output = ();
        #[inline(always)]
        fn call(self) {
            text(self.s, self.d, self.qkv, self.out);
        }
    }
    s.run(Task { s, d, qkv, out });
}

/// The op: the texts' token counts, in packed order, and the head count.
struct PackedAttention<'a> {
    lens: &'a [usize],
    heads: usize,
}

impl PackedAttention<'_> {
    fn dims(&self, layout: &Layout) -> candle_core::Result<Dims> {
        let (tokens, width) = layout.shape().dims2()?;
        let total: usize = self.lens.iter().sum();
        if total != tokens {
            candle_core::bail!("{OP}: texts of {total} tokens in all for {tokens} rows");
        }
        if self.heads == 0 || !width.is_multiple_of(3 * self.heads) {
            candle_core::bail!(
                "{OP}: {width} columns do not split into 3 × {} heads",
                self.heads
            );
        }
        Ok(Dims {
            hidden: width / 3,
            head_dim: width / 3 / self.heads,
            heads: self.heads,
        })
    }
}

impl CustomOp1 for PackedAttention<'_> {
    fn name(&self) -> &'static str {
        "minions-packed-attention"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let qkv = contiguous_f32(OP, s, l)?;
        let d = self.dims(l)?;
        let shape = Shape::from((qkv.len() / (3 * d.hidden), d.hidden));
        // AVX2 and FMA where the CPU has them.
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V3::try_new() {
            return Ok((CpuStorage::F32(all_texts(simd, &d, qkv, self.lens)), shape));
        }
        Ok((CpuStorage::F32(all_texts(Plain, &d, qkv, self.lens)), shape))
    }
}

/// Every text of `qkv` (whose token counts `lens` cover its rows), one
/// parallel task each; `(tokens, hidden)` values.
fn all_texts<S: Lanes + Send + Sync>(s: S, d: &Dims, qkv: &[f32], lens: &[usize]) -> Vec<f32> {
    let tokens = qkv.len() / (3 * d.hidden);
    let mut out = vec![0f32; tokens * d.hidden];
    // Each text's rows of the input and of the output.
    let mut texts = Vec::with_capacity(lens.len());
    let (mut inp, mut rest) = (qkv, out.as_mut_slice());
    for &n in lens {
        let (i, i_rest) = inp.split_at(n * 3 * d.hidden);
        let (o, o_rest) = rest.split_at_mut(n * d.hidden);
        texts.push((i, o));
        (inp, rest) = (i_rest, o_rest);
    }
    texts.into_par_iter().for_each(|(i, o)| run(s, d, i, o));
    out
}

/// Self-attention of packed texts: `qkv` is `(tokens, 3·hidden)`, each
/// row a token's query (already scaled by 1/√head_dim), key and value;
/// `lens` the texts' token counts in row order. Returns `(tokens, hidden)`.
/// Contiguous f32 CPU tensors only; callers use the padded form elsewhere.
pub(crate) fn packed_attention(
    qkv: &Tensor,
    lens: &[usize],
    heads: usize,
) -> candle_core::Result<Tensor> {
    qkv.apply_op1_no_bwd(&PackedAttention { lens, heads })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{D, Device};

    /// The padded form with candle's ops, for reference.
    fn reference(qkv: &Tensor, lens: &[usize], heads: usize) -> candle_core::Result<Tensor> {
        let hidden = qkv.dim(1)? / 3;
        let hd = hidden / heads;
        let mut outs = Vec::new();
        let mut at = 0;
        for &n in lens {
            let t = qkv.narrow(0, at, n)?.reshape((n, 3, heads, hd))?;
            let q = t
                .narrow(1, 0, 1)?
                .squeeze(1)?
                .transpose(0, 1)?
                .contiguous()?;
            let k = t
                .narrow(1, 1, 1)?
                .squeeze(1)?
                .transpose(0, 1)?
                .contiguous()?;
            let v = t
                .narrow(1, 2, 1)?
                .squeeze(1)?
                .transpose(0, 1)?
                .contiguous()?;
            let p = candle_nn::ops::softmax(&q.matmul(&k.t()?)?, D::Minus1)?;
            outs.push(p.matmul(&v)?.transpose(0, 1)?.reshape((n, hidden))?);
            at += n;
        }
        Tensor::cat(&outs, 0)
    }

    #[test]
    fn matches_candle_per_text() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        // Lengths off every tile size, a head size off the lane count.
        for (lens, heads, hd) in [
            (vec![1usize, 5, 13, 8], 3usize, 12usize),
            (vec![17, 2], 2, 32),
            (vec![4], 1, 8),
        ] {
            let tokens: usize = lens.iter().sum();
            let qkv = Tensor::randn(0f32, 1.0, (tokens, 3 * heads * hd), &dev)?;
            let ours = packed_attention(&qkv, &lens, heads)?;
            let theirs = reference(&qkv, &lens, heads)?;
            let diff = (ours - &theirs)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff < 1e-5, "lens {lens:?}: max diff {diff}");
            // The portable path, which other CPUs take.
            let d = Dims {
                hidden: heads * hd,
                head_dim: hd,
                heads,
            };
            let plain = all_texts(Plain, &d, &qkv.flatten_all()?.to_vec1()?, &lens);
            let plain = Tensor::from_vec(plain, theirs.shape(), &dev)?;
            let diff = (plain - &theirs)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff < 1e-5, "plain, lens {lens:?}: max diff {diff}");
        }
        Ok(())
    }

    #[test]
    fn refuses_lengths_that_do_not_cover_the_rows() -> candle_core::Result<()> {
        let qkv = Tensor::zeros((6, 12), candle_core::DType::F32, &Device::Cpu)?;
        let err = packed_attention(&qkv, &[2, 3], 2)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("5 tokens in all for 6 rows")),
            "{err:?}"
        );
        let err = packed_attention(&qkv, &[6], 3).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("3 × 3 heads")),
            "{err:?}"
        );
        Ok(())
    }
}
