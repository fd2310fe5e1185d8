//! f32 linear layers on the CPU: gemm's product accumulated onto the bias
//! (and the residual), then GELU or a layer norm on the finished rows.
//!
//! Through candle a linear layer is a product into a zero-filled buffer,
//! then a broadcast add of the bias into a new buffer, then the residual
//! add into another, then the norm into a fourth: four fresh allocations
//! and four passes over activations that no longer fit in cache. Here the
//! output starts as bias (+ residual), written once; gemm (the same crate
//! and micro-kernels candle's product uses, AVX-512 where the CPU has it)
//! adds the product onto it; GELU and the layer norm run in place, row by
//! row. The sums are the same terms added in another order (the bias
//! first), so results differ from candle's in the last bits only.

use candle_core::Tensor;
use rayon::prelude::*;

use super::gelu::gelu;
use super::int8::Activation;
use super::layer_norm::{NormParams, normalise};

/// The op's name in errors.
const OP: &str = "f32 linear";
/// Rows per parallel task of the passes after the product.
const ROWS_PER_TASK: usize = 32;

/// A linear layer's f32 weight, transposed for the product, and its bias.
pub(crate) struct DenseWeight {
    /// Inner (input) size.
    k: usize,
    /// Output size.
    n: usize,
    /// `(in, out)`, row-major: input `i`, output `j` at `i * n + j`.
    w: Vec<f32>,
    bias: Vec<f32>,
}

impl DenseWeight {
    /// `w` is `(out, in)`, as checkpoints store it; `b` is `out`.
    pub(crate) fn new(w: &Tensor, b: &Tensor) -> candle_core::Result<Self> {
        let (n, k) = w.dims2()?;
        let bias: Vec<f32> = b.to_vec1()?;
        if bias.len() != n {
            candle_core::bail!("{OP}: bias of {} for {n} outputs", bias.len());
        }
        let w = w.t()?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        Ok(Self { k, n, w, bias })
    }
}

/// `x · W`, rows of `x` `k` long, added onto `out` (`m × n`, row-major):
/// gemm over every thread.
fn product(w: &DenseWeight, x: &[f32], out: &mut [f32]) {
    let m = x.len() / w.k;
    debug_assert!(out.len() == m * w.n && w.w.len() == w.k * w.n);
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 && m * w.n * w.k > 64 * 64 * 64 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let (n, k) = (w.n as isize, w.k as isize);
    // SAFETY: `out` holds `m × n` values, row stride `n`; `x` holds `m × k`,
    // row stride `k`; `w.w` holds `k × n`, row stride `n` (checked by the
    // callers and at load): every index gemm forms from these sizes and
    // strides is in bounds. `out` is borrowed mutably, so it aliases
    // neither input.
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            w.n,
            w.k,
            out.as_mut_ptr(),
            1,
            n,
            true,
            x.as_ptr(),
            1,
            k,
            w.w.as_ptr(),
            1,
            n,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `act(x · W + b) (+ residual)`, then layer-normed when `norm` is given.
fn run(
    w: &DenseWeight,
    x: &[f32],
    residual: Option<&[f32]>,
    act: Activation,
    norm: Option<&NormParams>,
) -> candle_core::Result<Vec<f32>> {
    // Sizes checked by `linear_op::linear`.
    let m = x.len() / w.k;
    if act == Activation::Gelu && residual.is_some() {
        // GELU applies to the product and bias alone; no layer has both.
        candle_core::bail!("{OP}: GELU with a residual");
    }
    // The bias, plus the residual: the product adds onto it. Written by
    // every thread, straight into fresh memory: a pass over tens of
    // megabytes is not one thread's job, and zeroing it first would be a
    // second pass.
    let len = m * w.n;
    let mut out = Vec::with_capacity(len);
    let rows = ROWS_PER_TASK * w.n;
    let fresh = &mut out.spare_capacity_mut()[..len];
    match residual {
        Some(r) => fresh
            .par_chunks_mut(rows)
            .zip(r.par_chunks(rows))
            .for_each(|(o, r)| {
                for (o, r) in o.chunks_exact_mut(w.n).zip(r.chunks_exact(w.n)) {
                    for ((o, r), b) in o.iter_mut().zip(r).zip(&w.bias) {
                        o.write(r + b);
                    }
                }
            }),
        None => fresh.par_chunks_mut(rows).for_each(|o| {
            for o in o.chunks_exact_mut(w.n) {
                for (o, &b) in o.iter_mut().zip(&w.bias) {
                    o.write(b);
                }
            }
        }),
    }
    // SAFETY: `len` is `m` rows of `n`, and chunks of whole rows cover
    // them; every row of every chunk was written whole above (the residual
    // holds `m × n` values and the bias `n`, checked by the callers and at
    // load).
    #[allow(unsafe_code)]
    unsafe {
        out.set_len(len);
    }
    product(w, x, &mut out);
    if act == Activation::Gelu || norm.is_some() {
        let after = |rows: &mut [f32]| {
            for row in rows.chunks_exact_mut(w.n) {
                if act == Activation::Gelu {
                    for v in row.iter_mut() {
                        *v = gelu(*v);
                    }
                }
                if let Some(norm) = norm {
                    normalise(row, norm);
                }
            }
        };
        out.par_chunks_mut(ROWS_PER_TASK * w.n)
            .for_each(|rows| vectorized(|| after(rows)));
    }
    Ok(out)
}

/// `f` compiled for AVX2 and FMA where the CPU has them.
#[inline(always)]
fn vectorized(f: impl FnOnce()) {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = pulp::x86::V3::try_new() {
        return v3.vectorize(f);
    }
    f()
}

impl super::linear_op::LinearKernel for DenseWeight {
    const OP: &'static str = OP;

    fn k(&self) -> usize {
        self.k
    }

    fn n(&self) -> usize {
        self.n
    }

    fn run(
        &self,
        x: &[f32],
        residual: Option<&[f32]>,
        act: Activation,
        norm: Option<&NormParams>,
    ) -> candle_core::Result<Vec<f32>> {
        run(self, x, residual, act, norm)
    }
}

/// `act(x · Wᵀ + b)`, plus `residual` when given, then layer-normed when
/// `norm` is given; `x` an f32 CPU tensor whose last dimension is the
/// weight's input size.
pub(crate) fn dense_linear(
    w: &DenseWeight,
    x: &Tensor,
    act: Activation,
    residual: Option<&Tensor>,
    norm: Option<&NormParams>,
) -> candle_core::Result<Tensor> {
    super::linear_op::linear(w, x, act, residual, norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Against candle's product, bias add, GELU, residual and norm: the
    /// same values to float rounding, at sizes off gemm's tiles.
    #[test]
    fn matches_candle_ops() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let (m, k, n) = (37, 45, 29);
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
        let b = Tensor::randn(0f32, 1.0, n, &dev)?;
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
        let r = Tensor::randn(0f32, 1.0, (m, n), &dev)?;
        let d = DenseWeight::new(&w, &b)?;
        let plain = x.matmul(&w.t()?)?.broadcast_add(&b)?;
        let close = |a: &Tensor, b: &Tensor| -> candle_core::Result<f32> {
            (a - b)?.abs()?.max_all()?.to_scalar::<f32>()
        };
        let ours = dense_linear(&d, &x, Activation::None, None, None)?;
        assert!(close(&ours, &plain)? < 1e-4);
        let ours = dense_linear(&d, &x, Activation::Gelu, None, None)?;
        assert!(close(&ours, &plain.gelu_erf()?)? < 1e-4);
        let p = NormParams::new(vec![1.5; n], vec![0.25; n], 1e-12)?;
        let ours = dense_linear(&d, &x, Activation::None, Some(&r), Some(&p))?;
        let mut want = (&plain + &r)?.flatten_all()?.to_vec1::<f32>()?;
        for row in want.chunks_exact_mut(n) {
            normalise(row, &p);
        }
        let want = Tensor::from_vec(want, (m, n), &dev)?;
        assert!(close(&ours, &want)? < 1e-4);
        let wrong = Tensor::zeros((m, k + 1), candle_core::DType::F32, &dev)?;
        let err = dense_linear(&d, &wrong, Activation::None, None, None).err();
        assert!(err.is_some_and(|e| e.to_string().contains("inner size 45")));
        Ok(())
    }
}
