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
