//! Self-attention over packed sequences: each text attends to its own
//! tokens only, with no padding and no mask.
//!
//! The padded form (candle's ops) scatters the packed states into a
//! `(batch, len)` layout, permutes query, key and value into heads, builds
//! one `(batch, heads, len, len)` score tensor, and gathers the result back:
//! several copies and large fresh allocations per layer, whose page faults
//! cost more than the arithmetic. Here one task per text reads its rows of
//! the packed `(tokens, 3·hidden)` product directly and writes its rows of
//! the `(tokens, hidden)` result.
//!
//! A tile of [`ROWS`] queries keeps one register lane per query, so only
//! the queries are copied into a layout of their own (column by column,
//! the tile's rows side by side): keys and values are read in place, a key
//! value broadcast to every lane and a value row loaded as it is. Scores
//! come out key by key with the tile's rows side by side, which is the
//! layout the softmax runs across and the context's products read. Every
//! sum is taken in the order the row-by-row form takes it (a dot product
//! over the head's columns in order, the softmax's sum in eight lanes by
//! key, the context over keys in order), so the bits are that form's. A
//! text's output depends on its tokens alone, not on the other texts of its
//! batch.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::contiguous_f32;
use super::lanes::{Lanes, Plain};
use super::softmax::softmax_lanes;

/// The op's name in errors.
const OP: &str = "packed attention";
/// Query rows per tile: one register's lanes.
const ROWS: usize = 8;
/// Keys scored side by side: enough independent sums to cover the
/// multiply-add's latency.
const KEYS: usize = 8;
/// Query rows per pass of the context's products.
const CROWS: usize = 4;
/// Columns per pass of the context's products: two registers.
const COLS: usize = 16;
/// A value row's columns of one pass.
type Block = [f32; COLS];

/// The shape every task shares.
struct Dims {
    /// Hidden size: query, key and value each take this many columns.
    hidden: usize,
    /// Columns per head.
    head_dim: usize,
    heads: usize,
}

/// One text's rows of the packed product and what its tiles need beside
/// them.
struct Text<'a> {
    /// The text's rows, `(n, 3·hidden)`.
    qkv: &'a [f32],
    /// Query tiles: head `h`, tile `t`, column `c` at `(h·tiles + t)·hd +
    /// c`, holding that column for the tile's [`ROWS`] rows; zero for rows
    /// past the text.
    q: Vec<[f32; ROWS]>,
    /// One tile's scores, then probabilities: key `j` at `j`, the tile's
    /// rows side by side.
    p: Vec<[f32; ROWS]>,
    /// Tokens.
    n: usize,
    /// Columns per head.
    hd: usize,
    /// Hidden size.
    hidden: usize,
    /// Query tiles per head.
    tiles: usize,
}

impl<'a> Text<'a> {
    /// Copies the queries of `qkv` (`(n, 3·hidden)`) into their tiles.
    #[inline(always)]
    fn new(d: &Dims, qkv: &'a [f32]) -> Self {
        let (hidden, hd) = (d.hidden, d.head_dim);
        let n = qkv.len() / (3 * hidden);
        let tiles = n.div_ceil(ROWS);
        let mut q = vec![[0.0; ROWS]; d.heads * tiles * hd];
        for (t, rows) in qkv.chunks(ROWS * 3 * hidden).enumerate() {
            for (r, row) in rows.chunks_exact(3 * hidden).enumerate() {
                for (h, qs) in row[..hidden].chunks_exact(hd).enumerate() {
                    let at = (h * tiles + t) * hd;
                    for (cell, &x) in q[at..at + hd].iter_mut().zip(qs) {
                        cell[r] = x;
                    }
                }
            }
        }
        Self {
            qkv,
            q,
            p: vec![[0.0; ROWS]; n],
            n,
            hd,
            hidden,
            tiles,
        }
    }

    /// Token `j`'s key for head `h`.
    #[inline(always)]
    fn key(&self, h: usize, j: usize) -> &[f32] {
        let at = j * 3 * self.hidden + self.hidden + h * self.hd;
        &self.qkv[at..at + self.hd]
    }

    /// Token `j`'s value for head `h`.
    #[inline(always)]
    fn value(&self, h: usize, j: usize) -> &[f32] {
        let at = j * 3 * self.hidden + 2 * self.hidden + h * self.hd;
        &self.qkv[at..at + self.hd]
    }

    /// Probabilities of head `h`, tile `t`, into `p`: scores `q · kᵀ`
    /// (the scale is in the query), then the softmax over keys.
    #[inline(always)]
    fn probabilities<S: Lanes>(&mut self, s: S, h: usize, t: usize) {
        let at = (h * self.tiles + t) * self.hd;
        let q = &self.q[at..at + self.hd];
        let mut p = std::mem::take(&mut self.p);
        let (groups, tail) = p.as_chunks_mut::<KEYS>();
        for (g, out) in groups.iter_mut().enumerate() {
            // Each key cut to the query's length, so the loop's indexing
            // needs no checks.
            let keys: [&[f32]; KEYS] =
                std::array::from_fn(|i| &self.key(h, g * KEYS + i)[..q.len()]);
            let mut acc = [s.zero(); KEYS];
            for (c, q) in q.iter().enumerate() {
                let q = s.load(*q);
                for (acc, k) in acc.iter_mut().zip(&keys) {
                    *acc = s.mul_add(q, s.splat(k[c]), *acc);
                }
            }
            for (o, acc) in out.iter_mut().zip(acc) {
                *o = s.store(acc);
            }
        }
        let first = groups.len() * KEYS;
        for (i, o) in tail.iter_mut().enumerate() {
            let mut acc = s.zero();
            for (q, &k) in q.iter().zip(self.key(h, first + i)) {
                acc = s.mul_add(s.load(*q), s.splat(k), acc);
            }
            *o = s.store(acc);
        }
        softmax_lanes(&mut p);
        self.p = p;
    }

    /// `p · v` for tile `t` of head `h`, into the text's rows `out`
    /// (`(n, hidden)`).
    #[inline(always)]
    fn context<S: Lanes>(&self, s: S, t: usize, h: usize, out: &mut [f32]) {
        let (n, hd) = (self.n, self.hd);
        let rows = ROWS.min(n - t * ROWS);
        for half in 0..rows.div_ceil(CROWS) {
            let lanes = half * CROWS..(half + 1) * CROWS;
            for c0 in (0..hd).step_by(COLS) {
                let cols = COLS.min(hd - c0);
                let mut acc = [[s.zero(); 2]; CROWS];
                for (j, p) in self.p.iter().enumerate() {
                    let v = self.value(h, j);
                    let v = match <&Block>::try_from(&v[c0..c0 + cols]) {
                        Ok(v) => split(s, v),
                        Err(_) => {
                            let mut b = [0.0; COLS];
                            b[..cols].copy_from_slice(&v[c0..]);
                            split(s, &b)
                        }
                    };
                    for (acc, &p) in acc.iter_mut().zip(&p[lanes.clone()]) {
                        let p = s.splat(p);
                        acc[0] = s.mul_add(p, v[0], acc[0]);
                        acc[1] = s.mul_add(p, v[1], acc[1]);
                    }
                }
                for (r, acc) in acc.iter().enumerate().take(rows - half * CROWS) {
                    let at = (t * ROWS + half * CROWS + r) * self.hidden + h * hd + c0;
                    let block = join(s, acc);
                    out[at..at + cols].copy_from_slice(&block[..cols]);
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
    if qkv.is_empty() || d.head_dim == 0 {
        return;
    }
    let mut text = Text::new(d, qkv);
    for h in 0..d.heads {
        for t in 0..text.tiles {
            text.probabilities(s, h, t);
            text.context(s, t, h, out);
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

    /// Row by row, in the order the tiles sum: each score a fused
    /// multiply-add over the head's columns in order, the softmax of one
    /// row, each context value over keys in order.
    fn row_by_row(qkv: &[f32], lens: &[usize], heads: usize, hd: usize) -> Vec<f32> {
        let hidden = heads * hd;
        let mut out = Vec::new();
        let mut first = 0;
        for &n in lens {
            let row = |i: usize| &qkv[(first + i) * 3 * hidden..(first + i + 1) * 3 * hidden];
            for i in 0..n {
                for h in 0..heads {
                    let q = &row(i)[h * hd..(h + 1) * hd];
                    let mut p: Vec<f32> = (0..n)
                        .map(|j| {
                            let k = &row(j)[hidden + h * hd..hidden + (h + 1) * hd];
                            q.iter().zip(k).fold(0.0, |a, (&q, &k)| q.mul_add(k, a))
                        })
                        .collect();
                    super::super::softmax::softmax_in_place(&mut p);
                    for c in 0..hd {
                        out.push((0..n).fold(0.0f32, |a, j| {
                            p[j].mul_add(row(j)[2 * hidden + h * hd + c], a)
                        }));
                    }
                }
            }
            first += n;
        }
        out
    }

    /// Where the CPU has FMA, the tiles give the row-by-row form's bits:
    /// a text's vector does not depend on how attention is laid out.
    #[test]
    fn tiles_give_the_row_by_row_bits() -> candle_core::Result<()> {
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V3::try_new() {
            for (lens, heads, hd) in [
                (vec![1usize, 5, 13, 8, 33], 3usize, 12usize),
                (vec![17, 2, 40], 2, 32),
            ] {
                let tokens: usize = lens.iter().sum();
                let qkv = Tensor::randn(0f32, 1.0, (tokens, 3 * heads * hd), &Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let d = Dims {
                    hidden: heads * hd,
                    head_dim: hd,
                    heads,
                };
                let ours = all_texts(simd, &d, &qkv, &lens);
                let want = row_by_row(&qkv, &lens, heads, hd);
                let same = ours
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "lens {lens:?}, {heads} heads of {hd}");
            }
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
