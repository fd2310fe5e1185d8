//! Eight f32 lanes, the register width the CPU kernels are written for:
//! AVX2 and FMA intrinsics on x86-64 (through `pulp`'s safe wrappers),
//! plain arrays elsewhere, which compilers map onto the CPU's own vectors.
//!
//! Kernels written against [`Lanes`] say exactly which products are
//! vector multiply-adds, where leaving loops to the auto-vectoriser
//! sometimes leaves them scalar.

/// Eight-lane f32 arithmetic. Implementations are zero-sized proofs that
/// the CPU runs them; the kernel body must be inlined into code compiled
/// for that CPU (see [`Lanes::run`]).
pub(super) trait Lanes: Copy {
    /// One register of eight f32.
    type V: Copy;
    /// All lanes zero.
    fn zero(self) -> Self::V;
    /// All lanes `x`.
    fn splat(self, x: f32) -> Self::V;
    /// `a · b + c`, lane by lane (fused where the CPU has FMA).
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// The register holding `x`.
    fn load(self, x: [f32; 8]) -> Self::V;
    /// The lanes of `v`.
    fn store(self, v: Self::V) -> [f32; 8];
    /// Runs `f` compiled for these lanes' instruction set: what it inlines
    /// uses them.
    fn run<F: pulp::NullaryFnOnce>(self, f: F) -> F::Output;
}

/// AVX2 and FMA (x86-64-v3).
#[cfg(target_arch = "x86_64")]
impl Lanes for pulp::x86::V3 {
    type V = pulp::f32x8;

    #[inline(always)]
    fn zero(self) -> Self::V {
        self.splat_f32x8(0.0)
    }

    #[inline(always)]
    fn splat(self, x: f32) -> Self::V {
        self.splat_f32x8(x)
    }

    #[inline(always)]
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        self.mul_add_f32x8(a, b, c)
    }

    #[inline(always)]
    fn load(self, x: [f32; 8]) -> Self::V {
        pulp::cast(x)
    }

    #[inline(always)]
    fn store(self, v: Self::V) -> [f32; 8] {
        pulp::cast(v)
    }

    #[inline(always)]
    fn run<F: pulp::NullaryFnOnce>(self, f: F) -> F::Output {
        self.vectorize(f)
    }
}

/// Plain arrays, for CPUs without a hand-written path.
#[derive(Clone, Copy, Debug)]
pub(super) struct Plain;

impl Lanes for Plain {
    type V = [f32; 8];

    #[inline(always)]
    fn zero(self) -> Self::V {
        [0.0; 8]
    }

    #[inline(always)]
    fn splat(self, x: f32) -> Self::V {
        [x; 8]
    }

    #[inline(always)]
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        let mut out = c;
        for ((o, a), b) in out.iter_mut().zip(a).zip(b) {
            *o += a * b;
        }
        out
    }

    #[inline(always)]
    fn load(self, x: [f32; 8]) -> Self::V {
        x
    }

    #[inline(always)]
    fn store(self, v: Self::V) -> [f32; 8] {
        v
    }

    #[inline(always)]
    fn run<F: pulp::NullaryFnOnce>(self, f: F) -> F::Output {
        f.call()
    }
}
