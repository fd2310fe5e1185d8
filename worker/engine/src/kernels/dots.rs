//! Many dot products of f32 rows against many others, and sums of rows
//! weighted by scalars: the decoder steps of the speech family (logits over
//! the vocabulary table, attention of a few queries over cached keys).
//!
//! Left to the compiler, such loops build for the baseline x86-64 CPU
//! (four lanes, no fused multiply-add) and chain every sum through one
//! register. Here the AVX2 path keeps eight independent sums, eight rows
//! of one operand against one row of the other, in fused multiply-adds:
//! the other operand is read once, in order (for the logits, the 80 MB
//! table streams from memory once a step, whatever the rows). A dot
//! product's terms are summed in one order whatever the blocking: element
//! `i` into lane `i % 8`, the lanes in [`hsum8`]'s order, then the tail,
//! so a row's results do not depend on how many other rows run beside it.
//! The portable path sums in the same order without fusing, so its last
//! bits may differ from the AVX2 path's.

use super::lanes::{Lanes, Plain};
use super::{Math, hsum8};

/// Rows of `a` per block of [`dots`], against one row of `b`: eight sums
/// at once. (Measured at the logits' shapes, 8 × 51,864 × 384: blocks of
/// 4 × 2 and 2 × 4 rows, which read several rows of `b` at once, took
/// 1.3-2× as long.)
const BLOCK: usize = 8;

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

/// The first `body` values of `v` (a multiple of eight) as lanes.
#[inline(always)]
fn lanes_of(v: &[f32], body: usize) -> &[[f32; 8]] {
    pulp::as_arrays::<8, f32>(&v[..body]).0
}

/// `N` rows of `a` against row `b`, eight lanes at a time: the sums'
/// lanes. Every row holds `len` lanes.
#[inline(always)]
fn block<S: Lanes, const N: usize>(
    s: S,
    a: [&[[f32; 8]]; N],
    b: &[[f32; 8]],
    len: usize,
) -> [S::V; N] {
    let a = a.map(|r| &r[..len]);
    let b = &b[..len];
    let mut acc = [s.zero(); N];
    for (i, y) in b.iter().enumerate() {
        let y = s.load(*y);
        for (acc, ar) in acc.iter_mut().zip(&a) {
            *acc = s.mul_add(s.load(ar[i]), y, *acc);
        }
    }
    acc
}

/// [`dots`] compiled for `S`: for each row of `b`, blocks of [`BLOCK`]
/// rows of `a`, the rest one by one.
#[inline(always)]
fn dots_with<S: Lanes>(s: S, a: &[f32], b: &[f32], d: usize, out: &mut [f32]) {
    let na = a.len() / d;
    let body = d - d % 8;
    let len = body / 8;
    let lanes = |v| lanes_of(v, body);
    let arow = |r: usize| &a[r * d..(r + 1) * d];
    for (brow, o) in b.chunks_exact(d).zip(out.chunks_exact_mut(na)) {
        let bl = lanes(brow);
        let mut r = 0;
        while r + BLOCK <= na {
            let al: [&[[f32; 8]]; BLOCK] = std::array::from_fn(|i| lanes(arow(r + i)));
            let acc = block::<S, BLOCK>(s, al, bl, len);
            for (i, acc) in acc.iter().enumerate() {
                o[r + i] = finish(s, *acc, arow(r + i), brow, body);
            }
            r += BLOCK;
        }
        for (r, o) in o.iter_mut().enumerate().skip(r) {
            let acc = block::<S, 1>(s, [lanes(arow(r))], bl, len);
            *o = finish(s, acc[0], arow(r), brow, body);
        }
    }
}

/// Every dot product of a row of `a` with a row of `b`, rows `d` long:
/// `out[k · rows_a + r] = a_r · b_k` (`out` holds `rows_a · rows_b`).
/// Fastest with many rows in `a`: `b` is read once, a row at a time.
pub(crate) fn dots(a: &[f32], b: &[f32], d: usize, out: &mut [f32]) {
    assert!(
        d > 0 && a.len().is_multiple_of(d) && b.len().is_multiple_of(d),
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
    match Math::detect() {
        #[cfg(target_arch = "x86_64")]
        Math::V3(s) => s.run(Task { s, a, b, d, out }),
        Math::Plain => Plain.run(Task {
            s: Plain,
            a,
            b,
            d,
            out,
        }),
    }
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
    match Math::detect() {
        #[cfg(target_arch = "x86_64")]
        Math::V3(s) => s.run(Task { s, p, rows, out }),
        Math::Plain => Plain.run(Task {
            s: Plain,
            p,
            rows,
            out,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(i: usize) -> f32 {
        ((i * 37 % 23) as f32 - 11.0) / 9.0
    }

    #[test]
    fn dots_match_plain_sums_and_do_not_depend_on_the_blocking() {
        // Eleven rows of `a`: one block of eight and three alone.
        let (na, nb) = (11, 5);
        for d in [8, 19, 64, 384] {
            let a: Vec<f32> = (0..na * d).map(val).collect();
            let b: Vec<f32> = (0..nb * d).map(|i| val(i + 5)).collect();
            let mut out = vec![0f32; na * nb];
            dots(&a, &b, d, &mut out);
            for k in 0..nb {
                for r in 0..na {
                    let want: f32 = (0..d).map(|i| a[r * d + i] * b[k * d + i]).sum();
                    let got = out[k * na + r];
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
