//! A BERT layer's feed-forward block as one op on the CPU, int8:
//! `norm(x + down(gelu(up(x))))`, each task running both products on its
//! rows back to back ([`super::int8::run_ffn`]), so the intermediate
//! activations never leave the core's cache.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};

use super::NormParams;
use super::contiguous_f32;
use super::int8::{Int8Weight, ffn_fits, inner, run_ffn};

/// The op's name in errors.
const OP: &str = "int8 feed-forward";

/// The op: both weights and the layer norm after.
struct Ffn<'a> {
    up: &'a Int8Weight,
    down: &'a Int8Weight,
    norm: &'a NormParams,
}

impl CustomOp1 for Ffn<'_> {
    fn name(&self) -> &'static str {
        "minions-int8-ffn"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(OP, s, l)?;
        let k = inner(self.up);
        if !ffn_fits(self.up, self.down) {
            candle_core::bail!("{OP}: the two layers' sizes or kernels do not chain");
        }
        if k == 0 || l.dims().last() != Some(&k) {
            candle_core::bail!("{OP}: input {:?}, inner size {k}", l.dims());
        }
        if self.norm.len() != k {
            candle_core::bail!("{OP}: layer norm of {} after {k} outputs", self.norm.len());
        }
        let mut out = run_ffn(self.up, self.down, x, Some(self.norm));
        super::fault::apply(&mut out, k);
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }
}

/// `norm(x + down(gelu(up(x))))` for `x` an f32 CPU tensor whose last
/// dimension is `up`'s input size; `up` and `down` chain back to it.
pub(crate) fn int8_ffn(
    up: &Int8Weight,
    down: &Int8Weight,
    x: &Tensor,
    norm: &NormParams,
) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&Ffn { up, down, norm })
}
