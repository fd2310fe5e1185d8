//! CPU kernels of our own, plugged into candle through its custom-op
//! interface where candle's own are slow (scalar `erf` in GELU). Each works
//! on contiguous f32 tensors and falls back to candle's op on other devices.

mod gelu;
mod int8;
mod softmax;

pub(crate) use gelu::bias_gelu;
pub(crate) use int8::{Activation, Int8Weight, available as int8_available, linear as int8_linear};
pub(crate) use softmax::masked_softmax;
