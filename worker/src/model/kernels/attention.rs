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
use super::softmax::softmax_in_place;

/// The op's name in errors.
const OP: &str = "packed attention";
/// Lanes per register-sized block of columns.
const LANES: usize = 8;
/// Rows per micro-tile.
const ROWS: usize = 4;

/// The shape every task shares.
struct Dims {
    /// Hidden size: query, key and value each take this many columns.
    hidden: usize,
    /// Columns per head.
    head_dim: usize,
    heads: usize,
}

/// One head's query, key and value for one text, copied out of the packed
/// product into zero-padded blocks the tiles read whole, with its scores.
struct Scratch {
    /// `(n4, hd8)`: the text's query rows.
    q: Vec<f32>,
    /// `(hd8, n8)`: the keys, transposed.
    kt: Vec<f32>,
    /// `(n, hd8)`: the values.
    v: Vec<f32>,
    /// `(n4, n8)`: scores, then probabilities.
    p: Vec<f32>,
    n: usize,
    n8: usize,
    hd8: usize,
}

impl Scratch {
    fn new(n: usize, head_dim: usize) -> Self {
        let (n4, n8, hd8) = (
            n.next_multiple_of(ROWS),
            n.next_multiple_of(LANES),
            head_dim.next_multiple_of(LANES),
        );
        Self {
            q: vec![0.0; n4 * hd8],
            kt: vec![0.0; hd8 * n8],
            v: vec![0.0; n * hd8],
            p: vec![0.0; n4 * n8],
            n,
            n8,
            hd8,
        }
    }

    /// Copies head `h` of the text's rows `qkv` (`(n, 3·hidden)`) in.
    /// Padding stays zero: only the real rows and columns are written.
    #[inline(always)]
    fn load(&mut self, d: &Dims, qkv: &[f32], h: usize) {
        let (hd, hd8, n8) = (d.head_dim, self.hd8, self.n8);
        let at = h * hd;
        for (i, row) in qkv.chunks_exact(3 * d.hidden).enumerate() {
            let q = &row[at..at + hd];
            let k = &row[d.hidden + at..d.hidden + at + hd];
            let v = &row[2 * d.hidden + at..2 * d.hidden + at + hd];
            self.q[i * hd8..i * hd8 + hd].copy_from_slice(q);
            self.v[i * hd8..i * hd8 + hd].copy_from_slice(v);
            for (c, &k) in k.iter().enumerate() {
                self.kt[c * n8 + i] = k;
            }
        }
    }

    /// Scores `q · kᵀ` (the scale is in the query), then softmax per row.
    #[inline(always)]
    fn probabilities(&mut self, head_dim: usize) {
        let (n, n8, hd8) = (self.n, self.n8, self.hd8);
        for (i0, (q, p)) in self
            .q
            .chunks_exact(ROWS * hd8)
            .zip(self.p.chunks_exact_mut(ROWS * n8))
            .enumerate()
        {
            for j0 in (0..n8).step_by(LANES) {
                let mut acc = [[0f32; LANES]; ROWS];
                for c in 0..head_dim {
                    let k = &self.kt[c * n8 + j0..c * n8 + j0 + LANES];
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let qv = q[r * hd8 + c];
                        for (a, &k) in acc.iter_mut().zip(k) {
                            *a += qv * k;
                        }
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    p[r * n8 + j0..r * n8 + j0 + LANES].copy_from_slice(acc);
                }
            }
            for r in 0..ROWS.min(n.saturating_sub(i0 * ROWS)) {
                softmax_in_place(&mut p[r * n8..r * n8 + n]);
            }
        }
    }

    /// `p · v` for head `h`, into the text's rows `out` (`(n, hidden)`).
    #[inline(always)]
    fn context(&self, d: &Dims, h: usize, out: &mut [f32]) {
        let (n, n8, hd8, hd) = (self.n, self.n8, self.hd8, d.head_dim);
        for (i0, p) in self.p.chunks_exact(ROWS * n8).enumerate() {
            let rows = ROWS.min(n - i0 * ROWS);
            for c0 in (0..hd8).step_by(LANES) {
                let mut acc = [[0f32; LANES]; ROWS];
                for (j, v) in self.v.chunks_exact(hd8).enumerate() {
                    let v = &v[c0..c0 + LANES];
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let pv = p[r * n8 + j];
                        for (a, &v) in acc.iter_mut().zip(v) {
                            *a += pv * v;
                        }
                    }
                }
                let cols = LANES.min(hd - c0);
                for (r, acc) in acc.iter().enumerate().take(rows) {
                    let at = (i0 * ROWS + r) * d.hidden + h * hd + c0;
                    out[at..at + cols].copy_from_slice(&acc[..cols]);
                }
            }
        }
    }
}

/// Attention for one text: `qkv` its rows of the product, `out` its rows
/// of the result.
#[inline(always)]
fn text(d: &Dims, qkv: &[f32], out: &mut [f32]) {
    let n = qkv.len() / (3 * d.hidden);
    if n == 0 {
        return;
    }
    let mut s = Scratch::new(n, d.head_dim);
    for h in 0..d.heads {
        s.load(d, qkv, h);
        s.probabilities(d.head_dim);
        s.context(d, h, out);
    }
}

/// [`text`] compiled for x86-64-v3 (AVX2, FMA).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn vectorized(simd: pulp::x86::V3, d: &Dims, qkv: &[f32], out: &mut [f32]) {
    struct Task<'a, 'b> {
        d: &'a Dims,
        qkv: &'a [f32],
        out: &'b mut [f32],
    }
    impl pulp::NullaryFnOnce for Task<'_, '_> {
        type Output = ();
        #[inline(always)]
        fn call(self) {
            text(self.d, self.qkv, self.out);
        }
    }
    simd.vectorize(Task { d, qkv, out });
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
        let tokens = qkv.len() / (3 * d.hidden);
        let mut out = vec![0f32; tokens * d.hidden];
        // Each text's rows of the input and of the output.
        let mut texts = Vec::with_capacity(self.lens.len());
        let (mut inp, mut rest) = (qkv, out.as_mut_slice());
        for &n in self.lens {
            let (i, i_rest) = inp.split_at(n * 3 * d.hidden);
            let (o, o_rest) = rest.split_at_mut(n * d.hidden);
            texts.push((i, o));
            (inp, rest) = (i_rest, o_rest);
        }
        let d = &d;
        // Compiled for AVX2 and FMA where the CPU has them.
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V3::try_new() {
            texts
                .into_par_iter()
                .for_each(|(i, o)| vectorized(simd, d, i, o));
            return Ok((CpuStorage::F32(out), Shape::from((tokens, d.hidden))));
        }
        texts.into_par_iter().for_each(|(i, o)| text(d, i, o));
        Ok((CpuStorage::F32(out), Shape::from((tokens, d.hidden))))
    }
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
            let diff = (ours - theirs)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff < 1e-5, "lens {lens:?}: max diff {diff}");
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
