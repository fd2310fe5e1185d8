//! CPU kernels of our own, plugged into candle through its custom-op
//! interface where candle's own are slow (scalar `erf` in GELU). Each works
//! on contiguous f32 tensors and falls back to candle's op on other devices.

mod attention;
mod gelu;
mod int8;
mod softmax;

pub(crate) use attention::packed_attention;
pub(crate) use gelu::bias_gelu;
pub(crate) use int8::{Activation, Int8Weight, available as int8_available, linear as int8_linear};
pub(crate) use softmax::masked_softmax;

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

/// The values of a contiguous f32 CPU tensor, what every kernel here
/// reads; an error naming `op` otherwise.
fn contiguous_f32<'a>(
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
