//! The decoder's per-step work on the CPU, over plain slices: attention of
//! a few new positions against cached keys and values, and the logits of
//! the tied output projection. Through candle each of these is a batched
//! product whose operands gemm packs on every call (the whole 20 M-value
//! embedding table per step for the logits, every window's 1,500 encoder
//! keys per layer per step for cross-attention); here each value is read
//! once, straight from where it lies.

use rayon::prelude::*;

use crate::kernels::{Math, dots, weighted_sum};

/// Query rows per task of the encoder's attention: their scores against
/// a whole window (128 × 1,500 values, 750 KB) stay in the core's cache,
/// and a window still makes 12 tasks. (64 and 256 measured within 10%.)
const QUERY_BLOCK: usize = 128;

/// A key/value store laid out `(rows, heads, capacity, head_dim)`.
#[derive(Clone, Debug)]
pub(crate) struct KvHost {
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) heads: usize,
    pub(crate) cap: usize,
    pub(crate) hd: usize,
}

impl KvHost {
    /// An empty store for `rows` rows of up to `cap` positions.
    pub(crate) fn new(rows: usize, heads: usize, cap: usize, hd: usize) -> Self {
        Self {
            k: vec![0.0; rows * heads * cap * hd],
            v: vec![0.0; rows * heads * cap * hd],
            heads,
            cap,
            hd,
        }
    }

    fn row_len(&self) -> usize {
        self.heads * self.cap * self.hd
    }

    /// Rows held.
    pub(crate) fn rows(&self) -> usize {
        self.k.len() / self.row_len().max(1)
    }

    /// Writes the keys and values of `n` new positions from `pos` out of
    /// fused rows `qkv` (`rows·n × 3·d`, query first).
    pub(crate) fn append(&mut self, qkv: &[f32], n: usize, pos: usize) {
        let (h, hd, cap) = (self.heads, self.hd, self.cap);
        let d = h * hd;
        let row_len = self.row_len();
        for (r, (kr, vr)) in self
            .k
            .chunks_exact_mut(row_len)
            .zip(self.v.chunks_exact_mut(row_len))
            .enumerate()
        {
            for i in 0..n {
                let src = &qkv[(r * n + i) * 3 * d..(r * n + i + 1) * 3 * d];
                for head in 0..h {
                    let at = (head * cap + pos + i) * hd;
                    kr[at..at + hd].copy_from_slice(&src[d + head * hd..d + (head + 1) * hd]);
                    vr[at..at + hd]
                        .copy_from_slice(&src[2 * d + head * hd..2 * d + (head + 1) * hd]);
                }
            }
        }
    }

    /// Keeps only `rows`, in that order. Rows kept in ascending order (a
    /// batch whose finished rows leave) move within the store; others are
    /// copied into new ones.
    pub(crate) fn keep(&mut self, rows: &[usize]) {
        let len = self.row_len();
        if rows.windows(2).all(|w| w[0] < w[1]) {
            // Row `rows[i] ≥ i`: moving rows down in order never
            // overwrites one still to be moved.
            for (i, &r) in rows.iter().enumerate() {
                if r != i {
                    self.k.copy_within(r * len..(r + 1) * len, i * len);
                    self.v.copy_within(r * len..(r + 1) * len, i * len);
                }
            }
            self.k.truncate(rows.len() * len);
            self.v.truncate(rows.len() * len);
            return;
        }
        let pick = |src: &[f32]| -> Vec<f32> {
            let mut out = Vec::with_capacity(rows.len() * len);
            for &r in rows {
                out.extend_from_slice(&src[r * len..(r + 1) * len]);
            }
            out
        };
        self.k = pick(&self.k);
        self.v = pick(&self.v);
    }
}

/// Attention of `rows·n` queries (`q`: each row's `n` positions, `stride`
/// values apart, the heads' queries at the start of each, pre-scaled)
/// over `kv`: position `i` of a row sees the first `seen(i)` cached
/// positions. Returns `(rows·n, heads·head_dim)`.
pub(crate) fn attend(
    q: &[f32],
    stride: usize,
    n: usize,
    kv: &KvHost,
    seen: &(dyn Fn(usize) -> usize + Sync),
) -> Vec<f32> {
    let (h, hd, cap) = (kv.heads, kv.hd, kv.cap);
    let d = h * hd;
    let rows = kv.rows();
    let math = Math::detect();
    let mut out = vec![0f32; rows * n * d];
    out.par_chunks_mut(n * d)
        .enumerate()
        .for_each(|(r, out_r)| {
            let mut w = vec![0f32; cap];
            for head in 0..h {
                let base = (r * h + head) * cap * hd;
                let keys = &kv.k[base..base + cap * hd];
                let vals = &kv.v[base..base + cap * hd];
                for i in 0..n {
                    let t = seen(i).min(cap);
                    let qi = &q[(r * n + i) * stride + head * hd..][..hd];
                    let w = &mut w[..t];
                    // Keys as the many rows: eight sums at once.
                    dots(&keys[..t * hd], qi, hd, w);
                    let max = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let inv = (1.0 / math.exp_sum(w, max)) as f32;
                    w.iter_mut().for_each(|x| *x *= inv);
                    let o = &mut out_r[i * d + head * hd..i * d + (head + 1) * hd];
                    weighted_sum(w, &vals[..t * hd], o);
                }
            }
        });
    out
}

/// Logits `x · Eᵀ` for rows `x` (`rows × d`) over the table `e` (`vocab ×
/// d`, row-major): `rows` vectors of `vocab` values.
pub(crate) fn logits(x: &[f32], e: &[f32], d: usize) -> Vec<Vec<f32>> {
    let rows = x.len() / d;
    let vocab = e.len() / d;
    /// Vocabulary rows per task: the table is read once for every row.
    const CHUNK: usize = 512;
    let mut flat = vec![0f32; vocab * rows];
    // Laid out vocabulary-major while computing, each task writing its own
    // range; transposed to row-major at the end.
    flat.par_chunks_mut(CHUNK * rows)
        .enumerate()
        .for_each(|(c, out)| {
            let from = c * CHUNK * d;
            let to = (from + CHUNK * d).min(e.len());
            dots(x, &e[from..to], d, out);
        });
    (0..rows)
        .map(|r| (0..vocab).map(|v| flat[v * rows + r]).collect())
        .collect()
}

/// The encoder's self-attention over whole windows: `qkv` holds `rows ·
/// ctx` fused rows (query pre-scaled, key, value; `3·heads·hd` values);
/// returns `(rows · ctx, heads·hd)`. Each task takes a block of query rows
/// of one window and, head by head, forms their scores against every key
/// (gemm), exponentiates them in place and sums the values (gemm): the
/// scores never leave the cache.
pub(crate) fn encoder_attention(qkv: &[f32], ctx: usize, heads: usize, hd: usize) -> Vec<f32> {
    let d = heads * hd;
    let rows = qkv.len() / (3 * d * ctx).max(1);
    let mut out = vec![0f32; rows * ctx * d];
    let math = Math::detect();
    out.par_chunks_mut(ctx * d)
        .enumerate()
        .for_each(|(w, out_w)| {
            let win = &qkv[w * ctx * 3 * d..(w + 1) * ctx * 3 * d];
            out_w
                .par_chunks_mut(QUERY_BLOCK * d)
                .enumerate()
                .for_each(|(blk, out_b)| {
                    let q0 = blk * QUERY_BLOCK;
                    let m = out_b.len() / d;
                    let mut scores = vec![0f32; m * ctx];
                    for head in 0..heads {
                        let q = &win[q0 * 3 * d + head * hd..];
                        let k = &win[d + head * hd..];
                        let v = &win[2 * d + head * hd..];
                        // SAFETY: `scores` holds m × ctx values (row stride
                        // ctx); the query rows q0..q0+m of this window lie
                        // in `q` at row stride 3d, hd values each; the keys
                        // and values, ctx rows at stride 3d, hd values each,
                        // lie in `k` and `v` (their last row ends within the
                        // window's slice). No output aliases an input.
                        #[allow(unsafe_code)]
                        unsafe {
                            gemm::gemm(
                                m,
                                ctx,
                                hd,
                                scores.as_mut_ptr(),
                                1,
                                ctx as isize,
                                false,
                                q.as_ptr(),
                                1,
                                (3 * d) as isize,
                                k.as_ptr(),
                                (3 * d) as isize,
                                1,
                                0.0,
                                1.0,
                                false,
                                false,
                                false,
                                gemm::Parallelism::None,
                            );
                        }
                        for row in scores.chunks_exact_mut(ctx) {
                            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                            let inv = (1.0 / math.exp_sum(row, max)) as f32;
                            row.iter_mut().for_each(|x| *x *= inv);
                        }
                        let o = &mut out_b[head * hd..];
                        // SAFETY: as above; the output rows of this block
                        // lie in `o` at row stride d, hd values each.
                        #[allow(unsafe_code)]
                        unsafe {
                            gemm::gemm(
                                m,
                                hd,
                                ctx,
                                o.as_mut_ptr(),
                                1,
                                d as isize,
                                false,
                                scores.as_ptr(),
                                1,
                                ctx as isize,
                                v.as_ptr(),
                                1,
                                (3 * d) as isize,
                                0.0,
                                1.0,
                                false,
                                false,
                                false,
                                gemm::Parallelism::None,
                            );
                        }
                    }
                });
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_and_logits_match_plain_sums() {
        let (rows, h, hd, cap, n) = (2, 2, 3, 5, 2);
        let d = h * hd;
        let val = |i: usize| ((i * 37 % 11) as f32 - 5.0) / 7.0;
        let qkv: Vec<f32> = (0..rows * n * 3 * d).map(val).collect();
        let mut kv = KvHost::new(rows, h, cap, hd);
        kv.append(&qkv, n, 1);
        // Position 0 holds zeros; the new positions are 1 and 2, each
        // seeing itself and what is before it.
        let out = attend(&qkv, 3 * d, n, &kv, &|i| 2 + i);
        for r in 0..rows {
            for i in 0..n {
                for head in 0..h {
                    let q = &qkv[(r * n + i) * 3 * d + head * hd..][..hd];
                    let key = |p: usize| -> Vec<f32> {
                        if p == 0 {
                            vec![0.0; hd]
                        } else {
                            qkv[(r * n + p - 1) * 3 * d + d + head * hd..][..hd].to_vec()
                        }
                    };
                    let value = |p: usize| -> Vec<f32> {
                        if p == 0 {
                            vec![0.0; hd]
                        } else {
                            qkv[(r * n + p - 1) * 3 * d + 2 * d + head * hd..][..hd].to_vec()
                        }
                    };
                    let s: Vec<f32> = (0..2 + i)
                        .map(|p| q.iter().zip(key(p)).map(|(a, b)| a * b).sum())
                        .collect();
                    let z: f32 = s.iter().map(|x| x.exp()).sum();
                    for e in 0..hd {
                        let want: f32 = (0..2 + i).map(|p| s[p].exp() / z * value(p)[e]).sum();
                        let got = out[(r * n + i) * d + head * hd + e];
                        assert!((want - got).abs() < 1e-5, "{want} {got}");
                    }
                }
            }
        }
        // The encoder's form: every row sees the whole window.
        let ctx = 70;
        let qkv: Vec<f32> = (0..rows * ctx * 3 * d).map(|i| val(i) * 0.5).collect();
        let got = encoder_attention(&qkv, ctx, h, hd);
        for r in 0..rows {
            let mut kv = KvHost::new(1, h, ctx, hd);
            kv.append(&qkv[r * ctx * 3 * d..(r + 1) * ctx * 3 * d], ctx, 0);
            let want = attend(&qkv[r * ctx * 3 * d..], 3 * d, ctx, &kv, &|_| ctx);
            for (a, b) in want.iter().zip(&got[r * ctx * d..(r + 1) * ctx * d]) {
                assert!((a - b).abs() < 1e-5, "{a} {b}");
            }
        }
        kv.keep(&[1]);
        assert_eq!(kv.rows(), 1);
        let e: Vec<f32> = (0..1000 * d).map(val).collect();
        let x: Vec<f32> = (0..2 * d).map(|i| val(i + 3)).collect();
        let l = logits(&x, &e, d);
        for (r, row) in l.iter().enumerate() {
            for v in [0, 511, 512, 999] {
                let want: f32 = (0..d).map(|k| x[r * d + k] * e[v * d + k]).sum();
                assert!((row[v] - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn kept_rows_hold_their_own_values() {
        let (h, cap, hd) = (2, 3, 4);
        let len = h * cap * hd;
        let fill = |rows: usize| {
            let mut kv = KvHost::new(rows, h, cap, hd);
            for (i, x) in kv.k.iter_mut().enumerate() {
                *x = (i / len) as f32;
            }
            for (i, x) in kv.v.iter_mut().enumerate() {
                *x = -((i / len) as f32);
            }
            kv
        };
        for rows in [vec![1, 3, 4], vec![4, 0, 0, 2], vec![0, 1, 2, 3, 4], vec![]] {
            let mut kv = fill(5);
            kv.keep(&rows);
            assert_eq!(kv.rows(), rows.len());
            for (i, &r) in rows.iter().enumerate() {
                assert!(kv.k[i * len..(i + 1) * len].iter().all(|&x| x == r as f32));
                assert!(
                    kv.v[i * len..(i + 1) * len]
                        .iter()
                        .all(|&x| x == -(r as f32))
                );
            }
        }
    }
}
