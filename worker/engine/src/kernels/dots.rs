//! Many dot products of f32 rows against many others, and sums of rows
//! weighted by scalars: the decoder steps of the speech family (logits over
//! the vocabulary table, attention of a few queries over cached keys).
//!
//! Left to the compiler, such loops build for the baseline x86-64 CPU
//! (four lanes, no fused multiply-add) and chain every sum through one
//! register. Here the AVX2 path keeps eight independent sums per block
//! (four rows of one operand against two of the other) in fused
//! multiply-adds. A dot product's terms are summed in one order whatever
//! the blocking: element `i` into lane `i % 8`, the lanes in [`hsum8`]'s
//! order, then the tail, so a row's results do not depend on how many
//! other rows run beside it. The portable path sums in the same order
//! without fusing, so its last bits may differ from the AVX2 path's.

use super::lanes::{Lanes, Plain};
use super::{CpuPath, hsum8};

/// Rows of `b` per block of [`dots`].
const B_BLOCK: usize = 4;

/// Eight values of `v` from `at`.
#[inline(always)]
fn eight(v: &[f32], at: usize) -> [f32; 8] {
    let mut out = [0f32; 8];
    out.copy_from_slice(&v[at..at + 8]);
    out
}

/// The sum of `acc`'s lanes plus the products of the tails of `a` and
/// `b` (from `from`), in that order.
#[inline(always)]
fn finish<S: Lanes>(s: S, acc: S::V, a: &[f32], b: &[f32], from: usize) -> f32 {
    let mut sum = hsum8(s.store(acc));
    for (x, y) in a[from..].iter().zip(&b[from..]) {
        sum += x * y;
    }
    sum
}

/// [`dots`] compiled for `S`.
#[inline(always)]
fn dots_with<S: Lanes>(s: S, a: &[f32], b: &[f32], d: usize, out: &mut [f32]) {
    let na = a.len() / d;
    let body = d - d % 8;
    let mut k0 = 0;
    for (blk, o) in b.chunks(B_BLOCK * d).zip(out.chunks_mut(B_BLOCK * na)) {
        let nb = blk.len() / d;
        let mut r = 0;
        if nb == B_BLOCK {
            let bs: [&[f32]; B_BLOCK] = std::array::from_fn(|j| &blk[j * d..(j + 1) * d]);
            // Two rows of `a` against four of `b`: eight sums.
            while r + 2 <= na {
                let (a0, a1) = (&a[r * d..(r + 1) * d], &a[(r + 1) * d..(r + 2) * d]);
                let mut acc0 = [s.zero(); B_BLOCK];
                let mut acc1 = [s.zero(); B_BLOCK];
                let mut i = 0;
                while i < body {
                    let (x0, x1) = (s.load(eight(a0, i)), s.load(eight(a1, i)));
                    for j in 0..B_BLOCK {
                        let y = s.load(eight(bs[j], i));
                        acc0[j] = s.mul_add(x0, y, acc0[j]);
                        acc1[j] = s.mul_add(x1, y, acc1[j]);
                    }
                    i += 8;
                }
                for j in 0..B_BLOCK {
                    o[j * na + r] = finish(s, acc0[j], a0, bs[j], body);
                    o[j * na + r + 1] = finish(s, acc1[j], a1, bs[j], body);
                }
                r += 2;
            }
            if r < na {
                let a0 = &a[r * d..(r + 1) * d];
                let mut acc = [s.zero(); B_BLOCK];
                let mut i = 0;
                while i < body {
                    let x = s.load(eight(a0, i));
                    for j in 0..B_BLOCK {
                        acc[j] = s.mul_add(x, s.load(eight(bs[j], i)), acc[j]);
                    }
                    i += 8;
                }
                for j in 0..B_BLOCK {
                    o[j * na + r] = finish(s, acc[j], a0, bs[j], body);
                }
            }
        } else {
            // The last rows of `b`, fewer than a block: one at a time.
            for j in 0..nb {
                let bj = &blk[j * d..(j + 1) * d];
                for r in 0..na {
                    let ar = &a[r * d..(r + 1) * d];
                    let mut acc = s.zero();
                    let mut i = 0;
                    while i < body {
                        acc = s.mul_add(s.load(eight(ar, i)), s.load(eight(bj, i)), acc);
                        i += 8;
                    }
                    o[j * na + r] = finish(s, acc, ar, bj, body);
                }
            }
        }
        k0 += nb;
    }
    debug_assert_eq!(k0 * na, out.len());
}

/// Every dot product of a row of `a` with a row of `b`, rows `d` long:
/// `out[k · rows_a + r] = a_r · b_k` (`out` holds `rows_a · rows_b`).
pub(crate) fn dots(a: &[f32], b: &[f32], d: usize, out: &mut [f32]) {
    assert!(
        d > 0 && a.len() % d == 0 && b.len() % d == 0,
        "dots: rows of {d} in {} and {}",
        a.len(),
        b.len()
    );
    assert_eq!(out.len(), a.len() / d * (b.len() / d), "dots: output size");
    struct Task<'a, S> {
        s: S,
        a: &'a [f32],
        b: &'a [f32],
        d: usize,
        out: &'a mut [f32],
    }
    impl<S: Lanes> pulp::NullaryFnOnce for Task<'_, S> {
        type Output = ();
        #[inline(always)]
        fn call(self) {
            dots_with(self.s, self.a, self.b, self.d, self.out);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if CpuPath::get() >= CpuPath::Avx2
        && let Some(s) = pulp::x86::V3::try_new()
    {
        return s.run(Task { s, a, b, d, out });
    }
    let s = Plain;
    s.run(Task { s, a, b, d, out });
}

/// [`weighted_sum`] compiled for `S`, `out` of one width `N` × 8.
#[inline(always)]
fn weighted_with<S: Lanes, const N: usize>(s: S, p: &[f32], rows: &[f32], out: &mut [f32]) {
    let w = N * 8;
    let mut acc: [S::V; N] = std::array::from_fn(|c| s.load(eight(out, c * 8)));
    for (&pj, row) in p.iter().zip(rows.chunks_exact(w)) {
        let pv = s.splat(pj);
        for (c, a) in acc.iter_mut().enumerate() {
            *a = s.mul_add(pv, s.load(eight(row, c * 8)), *a);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        out[c * 8..c * 8 + 8].copy_from_slice(&s.store(*a));
    }
}

/// `out += Σ_j p[j] · rows_j`, rows as long as `out`, in order of `j`.
/// Rows of 64 and 128 values (the heads of Whisper's models) keep `out` in
/// registers throughout; other widths run element by element.
pub(crate) fn weighted_sum(p: &[f32], rows: &[f32], out: &mut [f32]) {
    let w = out.len();
    assert!(
        w > 0 && rows.len() >= p.len() * w,
        "weighted_sum: {} weights, {} values in rows of {w}",
        p.len(),
        rows.len()
    );
    struct Task<'a, S> {
        s: S,
        p: &'a [f32],
        rows: &'a [f32],
        out: &'a mut [f32],
    }
    impl<S: Lanes> pulp::NullaryFnOnce for Task<'_, S> {
        type Output = ();
        #[inline(always)]
        fn call(self) {
            let Self { s, p, rows, out } = self;
            match out.len() {
                64 => weighted_with::<S, 8>(s, p, rows, out),
                128 => weighted_with::<S, 16>(s, p, rows, out),
                w => {
                    for (&pj, row) in p.iter().zip(rows.chunks_exact(w)) {
                        for (o, v) in out.iter_mut().zip(row) {
                            *o += pj * v;
                        }
                    }
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if CpuPath::get() >= CpuPath::Avx2
        && let Some(s) = pulp::x86::V3::try_new()
    {
        return s.run(Task { s, p, rows, out });
    }
    let s = Plain;
    s.run(Task { s, p, rows, out });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(i: usize) -> f32 {
        ((i * 37 % 23) as f32 - 11.0) / 9.0
    }

    #[test]
    fn dots_match_plain_sums_and_do_not_depend_on_the_blocking() {
        for d in [8, 19, 64, 384] {
            let a: Vec<f32> = (0..5 * d).map(val).collect();
            let b: Vec<f32> = (0..11 * d).map(|i| val(i + 5)).collect();
            let mut out = vec![0f32; 5 * 11];
            dots(&a, &b, d, &mut out);
            for k in 0..11 {
                for r in 0..5 {
                    let want: f32 = (0..d).map(|i| a[r * d + i] * b[k * d + i]).sum();
                    let got = out[k * 5 + r];
                    assert!((want - got).abs() < 1e-4 * d as f32, "d {d}: {want} {got}");
                    // One row against one row: the same bits.
                    let mut one = [0f32];
                    dots(&a[r * d..(r + 1) * d], &b[k * d..(k + 1) * d], d, &mut one);
                    assert_eq!(one[0].to_bits(), got.to_bits(), "d {d} row {r} col {k}");
                }
            }
        }
    }

    #[test]
    fn weighted_sums_match_plain_sums() {
        for w in [64, 128, 24] {
            let p: Vec<f32> = (0..37).map(|i| val(i) * 0.1).collect();
            let rows: Vec<f32> = (0..37 * w).map(|i| val(i + 1)).collect();
            let mut out: Vec<f32> = (0..w).map(val).collect();
            let mut want = out.clone();
            weighted_sum(&p, &rows, &mut out);
            for (j, &pj) in p.iter().enumerate() {
                for (e, o) in want.iter_mut().enumerate() {
                    *o += pj * rows[j * w + e];
                }
            }
            for (a, b) in want.iter().zip(&out) {
                assert!((a - b).abs() < 1e-4, "width {w}: {a} {b}");
            }
        }
    }
}
