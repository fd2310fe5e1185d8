//! Causal self-attention on the CPU over per-sequence key/value caches kept
//! in host memory, with no candle ops in between: at decode time a pass
//! holds dozens of sequences of one token each, and per-sequence tensor ops
//! would cost more in dispatch than in arithmetic.
//!
//! Every (token, head) row is computed on its own: scores against its
//! sequence's keys up to its own position, softmax, weighted sum of values.
//! Nothing depends on which other sequences share the pass. Queries, keys,
//! values and attention weights are rounded to f16, as they are in
//! llama.cpp's f16 KV cache, and every sum is taken in the order
//! llama.cpp's CPU path takes it for a step of the same size ([`Order`]),
//! so the same bits come out.

use half::f16;
use rayon::prelude::*;

use crate::kernels::{Math, hsum8};

/// Rounds to f16 and back.
#[inline(always)]
pub(crate) fn round16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// One sequence's keys and values for one layer: `[kv_heads][capacity]
/// [head_dim]`, f16-rounded values kept as f32.
#[derive(Clone, Debug)]
pub(crate) struct HostKv {
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
}

/// The shape shared by every call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) scale: f32,
}

/// One sequence's part of the pass: its cache for this layer, how many
/// tokens it held before, how many are new, where its rows start.
pub(crate) struct SeqPart<'a> {
    pub(crate) kv: &'a mut HostKv,
    pub(crate) cap: usize,
    pub(crate) start: usize,
    pub(crate) n: usize,
    pub(crate) row: usize,
}

/// How llama.cpp's CPU path sums a step's attention products, which
/// depends on how many tokens the step holds: several go through
/// tinyBLAS, one f32 accumulator of eight lanes per output; a single token
/// through `ggml_vec_dot_f16`, four accumulators of eight lanes. The
/// products themselves are exact (f16 by f16), so only the order of the
/// additions differs, and it is followed here.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Order {
    /// One accumulator: element `i` into lane `i % 8`.
    Tiled,
    /// Four accumulators: element `i` into accumulator `(i / 8) % 4`,
    /// lane `i % 8`; elements past the last multiple of 32 in f64.
    Vec,
}

impl Order {
    /// The order llama.cpp uses for a step of `n` tokens whose products
    /// run over `k` elements (tinyBLAS takes only multiples of eight).
    fn for_step(n: usize, k: usize) -> Self {
        if n > 1 && k.is_multiple_of(8) {
            Self::Tiled
        } else {
            Self::Vec
        }
    }
}

/// `ggml_vec_dot_f16`'s reduction of its four accumulators.
#[inline(always)]
fn reduce4(acc: &[[f32; 8]; 4]) -> f32 {
    let mut x = [0f32; 8];
    for l in 0..8 {
        x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let t = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// The dot product of two equally long rows of f16-rounded values, summed
/// in `order`.
#[inline(always)]
fn dot(a: &[f32], b: &[f32], order: Order) -> f32 {
    match order {
        Order::Tiled => {
            let mut lanes = [0f32; 8];
            for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
                for l in 0..8 {
                    lanes[l] += x[l] * y[l];
                }
            }
            hsum8(lanes)
        }
        Order::Vec => {
            let np = a.len() - a.len() % 32;
            let mut acc = [[0f32; 8]; 4];
            for (x, y) in a[..np].chunks_exact(32).zip(b[..np].chunks_exact(32)) {
                for (j, acc) in acc.iter_mut().enumerate() {
                    for l in 0..8 {
                        acc[l] += x[8 * j + l] * y[8 * j + l];
                    }
                }
            }
            let mut s = f64::from(reduce4(&acc));
            for i in np..a.len() {
                s += f64::from(a[i] * b[i]);
            }
            s as f32
        }
    }
}

/// `out = Σ_j w[j] · values[j]` over rows of `hd` values, summed in
/// `order` over `j` (as llama.cpp's product of the transposed value cache
/// and the weights does, whose rows are padded with zero weights to a
/// multiple of 256). `acc` is scratch of at least `32 · hd`.
#[inline(always)]
fn weighted_sum(
    w: &[f32],
    values: &[f32],
    hd: usize,
    order: Order,
    acc: &mut [f32],
    out: &mut [f32],
) {
    match order {
        Order::Tiled => {
            let acc = &mut acc[..8 * hd];
            acc.fill(0.0);
            for (j, &wj) in w.iter().enumerate() {
                let lane = &mut acc[(j % 8) * hd..][..hd];
                for (a, &v) in lane.iter_mut().zip(&values[j * hd..][..hd]) {
                    *a += wj * v;
                }
            }
            for (d, o) in out.iter_mut().enumerate() {
                *o = hsum8(std::array::from_fn(|l| acc[l * hd + d]));
            }
        }
        Order::Vec => {
            let acc = &mut acc[..32 * hd];
            acc.fill(0.0);
            for (j, &wj) in w.iter().enumerate() {
                let slot = ((j / 8) % 4) * 8 + j % 8;
                let lane = &mut acc[slot * hd..][..hd];
                for (a, &v) in lane.iter_mut().zip(&values[j * hd..][..hd]) {
                    *a += wj * v;
                }
            }
            for (d, o) in out.iter_mut().enumerate() {
                let at = |a: usize, l: usize| acc[(a * 8 + l) * hd + d];
                let four: [[f32; 8]; 4] =
                    std::array::from_fn(|a| std::array::from_fn(|l| at(a, l)));
                *o = reduce4(&four);
            }
        }
    }
}

/// Appends the new keys and values (`k`, `v`: `[tokens, kv_heads,
/// head_dim]` for the whole pass) to each sequence's cache, then computes
/// attention for every new token: `q` is `[tokens, heads, head_dim]`; the
/// result is `[tokens, heads · head_dim]`.
///
/// Per (token, head): scores `round16(q) · k` summed as llama.cpp sums
/// them for a step of this sequence's size, times the scale; softmax as
/// ggml computes it ([`Math::exp_sum`], the reciprocal of the f64 sum
/// rounded to f32); weights rounded to f16; their sum over the values in
/// the same order family.
pub(crate) fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    parts: &mut [SeqPart<'_>],
    d: Dims,
) -> Vec<f32> {
    let hd = d.head_dim;
    for p in parts.iter_mut() {
        for t in 0..p.n {
            for h in 0..d.kv_heads {
                let src = ((p.row + t) * d.kv_heads + h) * hd;
                let dst = (h * p.cap + p.start + t) * hd;
                for i in 0..hd {
                    p.kv.k[dst + i] = round16(k[src + i]);
                    p.kv.v[dst + i] = round16(v[src + i]);
                }
            }
        }
    }
    let tokens: usize = parts.iter().map(|p| p.n).sum();
    let mut out = vec![0f32; tokens * d.heads * hd];
    // (sequence, token) for every row of the pass.
    let mut rows = Vec::with_capacity(tokens);
    for (s, p) in parts.iter().enumerate() {
        for t in 0..p.n {
            rows.push((s, t));
        }
    }
    let parts: &[SeqPart<'_>] = parts;
    let group = d.heads / d.kv_heads;
    let math = Math::detect();
    // One head of one row, into its `hd` outputs, with scratch buffers of
    // at least the row's length (`scores`), `hd` and `32 · hd`.
    let one_head = |out: &mut [f32],
                    (s, t): (usize, usize),
                    h: usize,
                    (scores, qh, acc): (&mut Vec<f32>, &mut [f32], &mut [f32])| {
        let p = &parts[s];
        let row = p.row + t;
        let len = p.start + t + 1;
        let qk_order = Order::for_step(p.n, hd);
        let pv_order = Order::for_step(p.n, 8);
        scores.resize(len, 0.0);
        let kvh = h / group;
        let qsrc = &q[(row * d.heads + h) * hd..][..hd];
        for (o, &x) in qh.iter_mut().zip(qsrc) {
            *o = round16(x);
        }
        let keys = &p.kv.k[kvh * p.cap * hd..][..len * hd];
        let mut max = f32::NEG_INFINITY;
        for (j, s) in scores.iter_mut().enumerate() {
            *s = dot(qh, &keys[j * hd..][..hd], qk_order) * d.scale;
            max = max.max(*s);
        }
        let sum = math.exp_sum(scores, max);
        let inv = (1.0 / sum) as f32;
        for s in scores.iter_mut() {
            *s = round16(*s * inv);
        }
        let values = &p.kv.v[kvh * p.cap * hd..][..len * hd];
        weighted_sum(scores, values, hd, pv_order, acc, out);
    };
    let scratch = || (Vec::new(), vec![0f32; hd], vec![0f32; 32 * hd]);
    if let [one] = rows[..] {
        // One sequence decoding: its heads split between the threads.
        out.par_chunks_mut(hd)
            .enumerate()
            .for_each_init(scratch, |(scores, qh, acc), (h, out)| {
                one_head(out, one, h, (scores, qh, acc))
            });
    } else {
        out.par_chunks_mut(d.heads * hd)
            .zip(rows.par_iter())
            .for_each_init(scratch, |(scores, qh, acc), (out, &row)| {
                for (h, out) in out.chunks_exact_mut(hd).enumerate() {
                    one_head(out, row, h, (&mut *scores, &mut *qh, &mut *acc));
                }
            });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], scale: f32) -> Vec<f32> {
        let s: Vec<f32> = keys
            .iter()
            .map(|k| {
                q.iter()
                    .zip(k)
                    .map(|(a, b)| round16(*a) * round16(*b))
                    .sum::<f32>()
                    * scale
            })
            .collect();
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let e: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        let mut out = vec![0f32; q.len()];
        for (w, v) in e.iter().zip(values) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += w / sum * round16(*x);
            }
        }
        out
    }

    #[test]
    fn matches_plain_attention_and_ignores_chunking() {
        let d = Dims {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            scale: 0.35,
        };
        let n = 5;
        let val = |i: usize| ((i * 37 % 101) as f32 / 50.0) - 1.0;
        let q: Vec<f32> = (0..n * 4 * 8).map(|i| val(i + 7)).collect();
        let k: Vec<f32> = (0..n * 2 * 8).map(|i| val(i + 3)).collect();
        let v: Vec<f32> = (0..n * 2 * 8).map(|i| val(i + 11)).collect();
        let cap = 8;
        let mut kv = HostKv {
            k: vec![0.0; 2 * cap * 8],
            v: vec![0.0; 2 * cap * 8],
        };
        let whole = attend(
            &q,
            &k,
            &v,
            &mut [SeqPart {
                kv: &mut kv,
                cap,
                start: 0,
                n,
                row: 0,
            }],
            d,
        );
        // Token 4, head 3 (kv head 1) against plain arithmetic.
        let keys: Vec<Vec<f32>> = (0..n).map(|t| k[(t * 2 + 1) * 8..][..8].to_vec()).collect();
        let values: Vec<Vec<f32>> = (0..n).map(|t| v[(t * 2 + 1) * 8..][..8].to_vec()).collect();
        let want = naive(&q[(4 * 4 + 3) * 8..][..8], &keys, &values, 0.35);
        for (a, b) in whole[(4 * 4 + 3) * 8..][..8].iter().zip(&want) {
            assert!((a - b).abs() < 2e-3, "{a} {b}");
        }
        // The same tokens read in two chunks give the same bits.
        let mut kv2 = HostKv {
            k: vec![0.0; 2 * cap * 8],
            v: vec![0.0; 2 * cap * 8],
        };
        let first = attend(
            &q[..2 * 32],
            &k[..2 * 16],
            &v[..2 * 16],
            &mut [SeqPart {
                kv: &mut kv2,
                cap,
                start: 0,
                n: 2,
                row: 0,
            }],
            d,
        );
        let rest = attend(
            &q[2 * 32..],
            &k[2 * 16..],
            &v[2 * 16..],
            &mut [SeqPart {
                kv: &mut kv2,
                cap,
                start: 2,
                n: 3,
                row: 0,
            }],
            d,
        );
        let chunked: Vec<f32> = first.into_iter().chain(rest).collect();
        assert_eq!(chunked, whole);
    }
}
