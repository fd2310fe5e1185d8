//! The candle op around a linear layer kernel of ours (f32 or int8): shape
//! checks, the optional residual as a second input, and the call.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

use super::NormParams;
use super::contiguous_f32;
use super::int8::Activation;

/// A linear layer's weight as a kernel of ours runs it.
pub(super) trait LinearKernel: Sync {
    /// The kernel's name in errors.
    const OP: &'static str;
    /// Inner (input) size.
    fn k(&self) -> usize;
    /// Output size.
    fn n(&self) -> usize;
    /// `act(x · W + b) (+ residual)`, then layer-normed when `norm` is
    /// given, for rows of `k`; inputs checked by [`linear`].
    fn run(
        &self,
        x: &[f32],
        residual: Option<&[f32]>,
        act: Activation,
        norm: Option<&NormParams>,
    ) -> candle_core::Result<Vec<f32>>;
}

/// The shape of `x` with its last dimension replaced by `n`.
fn out_shape(op: &str, layout: &Layout, k: usize, n: usize) -> candle_core::Result<Shape> {
    let mut dims = layout.dims().to_vec();
    match dims.last_mut() {
        Some(d) if *d == k => *d = n,
        _ => candle_core::bail!("{op}: input {:?}, inner size {k}", layout.dims()),
    }
    Ok(Shape::from(dims))
}

/// Checks the sizes, then runs the kernel.
fn checked<W: LinearKernel>(
    w: &W,
    x: &[f32],
    residual: Option<&[f32]>,
    act: Activation,
    norm: Option<&NormParams>,
) -> candle_core::Result<Vec<f32>> {
    let (k, n, op) = (w.k(), w.n(), W::OP);
    if k == 0 || !x.len().is_multiple_of(k) {
        candle_core::bail!("{op}: {} values are not rows of {k}", x.len());
    }
    let m = x.len() / k;
    if residual.is_some_and(|r| r.len() != m * n) {
        candle_core::bail!("{op}: residual is not {m} rows of {n}");
    }
    if let Some(norm) = norm
        && norm.len() != n
    {
        candle_core::bail!("{op}: layer norm of {} after {n} outputs", norm.len());
    }
    let mut out = w.run(x, residual, act, norm)?;
    super::fault::apply(&mut out, n);
    Ok(out)
}

/// The op: the weight, the activation, and the layer norm after it.
struct Op<'a, W>(&'a W, Activation, Option<&'a NormParams>);

impl<W: LinearKernel> CustomOp1 for Op<'_, W> {
    fn name(&self) -> &'static str {
        "minions-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let shape = out_shape(W::OP, l, self.0.k(), self.0.n())?;
        let out = checked(self.0, contiguous_f32(W::OP, s, l)?, None, self.1, self.2)?;
        Ok((CpuStorage::F32(out), shape))
    }
}

impl<W: LinearKernel> CustomOp2 for Op<'_, W> {
    fn name(&self) -> &'static str {
        "minions-linear-residual"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        rs: &CpuStorage,
        rl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let shape = out_shape(W::OP, l, self.0.k(), self.0.n())?;
        if rl.shape() != &shape {
            candle_core::bail!("{}: residual {:?}, output {shape:?}", W::OP, rl.dims());
        }
        let out = checked(
            self.0,
            contiguous_f32(W::OP, s, l)?,
            Some(contiguous_f32(W::OP, rs, rl)?),
            self.1,
            self.2,
        )?;
        Ok((CpuStorage::F32(out), shape))
    }
}

/// `act(x · W + b)`, plus `residual` when given, then layer-normed when
/// `norm` is given; `x` an f32 CPU tensor whose last dimension is the
/// weight's input size.
pub(super) fn linear<W: LinearKernel>(
    w: &W,
    x: &Tensor,
    act: Activation,
    residual: Option<&Tensor>,
    norm: Option<&NormParams>,
) -> candle_core::Result<Tensor> {
    let x = x.contiguous()?;
    let op = Op(w, act, norm);
    match residual {
        None => x.apply_op1_no_bwd(&op),
        Some(r) => x.apply_op2_no_bwd(&r.contiguous()?, &op),
    }
}
