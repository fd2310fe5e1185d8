//! CPU kernels of our own, plugged into candle through its custom-op
//! interface where candle's own are slow (scalar `erf` in GELU). Each works
//! on contiguous f32 tensors and falls back to candle's op on other devices.

mod attention;
mod cpu_path;
mod dense;
mod dots;
mod fault;
mod ffn;
mod gelu;
mod ggml_math;
mod int8;
mod lanes;
mod layer_norm;
mod linear_op;
mod peak;
mod pool;
mod quant;
mod softmax;

pub(crate) use attention::packed_attention;
pub use cpu_path::{CPU_PATH_ENV, CpuPath};
pub(crate) use dense::{DenseWeight, dense_linear};
pub(crate) use dots::{dots, weighted_sum};
pub use fault::{KERNEL_FAULT_ENV, kernel_fault};
pub(crate) use ffn::int8_ffn;
pub(crate) use gelu::bias_gelu;
pub(crate) use ggml_math::{Math, RmsWeight, rms_norm, swiglu};
pub(crate) use int8::{Activation, Int8Weight, available as int8_available, linear as int8_linear};
pub(crate) use layer_norm::{NormParams, layer_norm};
pub use peak::{Peak, PeakRate, measure_peak};
pub(crate) use pool::in_pool;
pub(crate) use quant::{QuantWeight, quant_linear};
pub(crate) use softmax::masked_softmax;

/// ggml's `hsum_float_8` (and tinyBLAS's `hsum`): eight lanes added in
/// the order its shuffles add them.
#[inline(always)]
pub(crate) fn hsum8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// `v` folded by `f` from `init`, eight lanes at a time so that it
/// vectorises: element `i` into lane `i % 8`, then the tail and the lanes
/// into one. For folds where that order does not matter (max, not sums).
#[inline(always)]
fn fold8(v: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut lanes = [init; 8];
    let chunks = v.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = f(*l, x);
        }
    }
    let m = tail.iter().fold(init, |m, &x| f(m, x));
    lanes.iter().fold(m, |a, &b| f(a, b))
}

/// The sum of `f(x)` over `v`, eight lanes at a time: element `i` always
/// goes to lane `i % 8`, so padding appended to a row (adding nothing)
/// leaves the sum of its tokens bit for bit the same. A text's vector then
/// does not depend on how long the other texts of its batch are.
#[inline(always)]
fn sum8_by(v: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0f32; 8];
    // Whole chunks apart from the tail, so that the lanes stay in one
    // register.
    let (chunks, tail) = v.as_chunks::<8>();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += f(x);
        }
    }
    for (l, &x) in lanes.iter_mut().zip(tail) {
        *l += f(x);
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    ((a + b) + (c + d)) + ((e + f) + (g + h))
}

/// The sum of `v`, as [`sum8_by`] adds.
#[inline(always)]
fn sum8(v: &[f32]) -> f32 {
    sum8_by(v, |x| x)
}

/// 1.5 · 2^23. Added to an f32 of magnitude below 2^22 it leaves the
/// value rounded to an integer (to nearest, ties to even: the default
/// rounding) in the low bits of the sum's mantissa.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `x` rounded to the nearest integer, ties to even, as an integer and as
/// an f32; for |x| < 2^22 (callers clamp). Only an add, a subtract and bit
/// operations, so loops of it vectorise; `round_ties_even` and the
/// saturating `as i32` do not, on x86-64.
#[inline(always)]
fn round_even(x: f32) -> (i32, f32) {
    let t = x + ROUND_MAGIC;
    let n = t
        .to_bits()
        .wrapping_sub(ROUND_MAGIC.to_bits())
        .cast_signed();
    (n, t - ROUND_MAGIC)
}

/// The values of a contiguous f32 CPU tensor, what every kernel here
/// reads; an error naming `op` otherwise.
pub(crate) fn contiguous_f32<'a>(
    op: &str,
    s: &'a candle_core::CpuStorage,
    l: &candle_core::Layout,
) -> candle_core::Result<&'a [f32]> {
    let candle_core::CpuStorage::F32(v) = s else {
        candle_core::bail!("{op}: f32 tensors only");
    };
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{op}: contiguous tensors only");
    };
    Ok(&v[a..b])
}

#[cfg(test)]
mod tests {
    use super::round_even;

    /// The same integers as `round_ties_even`, ties and negatives included.
    #[test]
    fn round_even_matches_the_standard_library() {
        for x in [
            0.0f32,
            -0.0,
            0.5,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.5,
            0.49999997,
            126.5,
            -127.4,
            127.0,
            1e-30,
            -3.7,
            4_194_303.5,
            -4_194_303.5,
        ] {
            let (n, f) = round_even(x);
            let want = x.round_ties_even();
            assert_eq!(n as f32, want, "{x}");
            assert_eq!(f, want, "{x}");
        }
        let mut x = -200.0f32;
        while x < 200.0 {
            assert_eq!(round_even(x).0 as f32, x.round_ties_even(), "{x}");
            x += 0.0625;
        }
    }
}
