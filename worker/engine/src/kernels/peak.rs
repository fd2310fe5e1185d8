//! This CPU's measured peak for the instructions the embedding products
//! live on, so that a benchmark can print what share of it a run reaches:
//! - f32: the fused multiply-add gemm runs, 512-bit (`vfmadd…ps zmm`, 16
//!   products each) where the CPU has AVX-512 F (gemm picks it whatever the
//!   path cap), else 256-bit (8);
//! - int8: the instruction of the int8 kernel a path packs for:
//!   `vpdpbusd zmm` (64 byte products), `vpdpbusd ymm` (32) or `vpmaddwd
//!   ymm` (16 products of 16-bit pairs); none on the portable path.
//!
//! Sixteen independent accumulators per thread so that latency never binds,
//! on every core at once, for about a quarter of a second each. Guests of
//! one machine kind land on different hosts, so a benchmark measures the
//! peak beside the run it is set against.

use std::time::Instant;

use super::CpuPath;

/// Instructions per thread in one measurement: 16 per iteration.
const ITERS: u64 = 20_000_000;

/// One instruction's measured rate.
#[derive(Clone, Copy, Debug)]
pub struct PeakRate {
    /// The instruction, as a reader would search for it.
    pub instruction: &'static str,
    /// Multiply-adds per second over every core.
    pub macs_per_s: f64,
}

/// A CPU path's peaks for the f32 and int8 products.
#[derive(Clone, Copy, Debug)]
pub struct Peak {
    /// The f32 products' instruction; `None` without FMA.
    pub f32: Option<PeakRate>,
    /// The int8 kernel's instruction on this path; `None` on the portable
    /// path (plain Rust).
    pub int8: Option<PeakRate>,
}

/// Measures the peaks of `path` on every core (each takes about a quarter
/// of a second). Paths above what the CPU has measure what it would run.
pub fn measure_peak(path: CpuPath) -> Peak {
    #[cfg(target_arch = "x86_64")]
    {
        x86::measure(path)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = path;
        Peak {
            f32: None,
            int8: None,
        }
    }
}

/// Multiply-adds per second with one thread per core, each running `f`
/// (which does `ITERS × 16` instructions of `macs` each).
fn rate(macs: u32, f: fn(u64) -> i64) -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let t = Instant::now();
    let mut sink = 0i64;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads).map(|_| s.spawn(|| f(ITERS))).collect();
        for h in hs {
            sink = sink.wrapping_add(h.join().unwrap_or_default());
        }
    });
    std::hint::black_box(sink);
    (ITERS * 16 * threads as u64 * u64::from(macs)) as f64 / t.elapsed().as_secs_f64()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{CpuPath, Peak, PeakRate, rate};
    use std::arch::x86_64::{
        __m256, __m256i, __m512, __m512i, _mm256_add_epi32, _mm256_dpbusd_avx_epi32,
        _mm256_fmadd_ps, _mm256_madd_epi16, _mm256_set1_epi32, _mm256_set1_ps, _mm512_add_epi32,
        _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_reduce_add_epi32, _mm512_reduce_add_ps,
        _mm512_set1_epi32, _mm512_set1_ps,
    };

    /// Sixteen accumulators, `iters` rounds of `step` on each; their sum.
    macro_rules! unrolled {
        ($iters:expr, $init:expr, $step:expr) => {{
            let mut acc = [$init; 16];
            for _ in 0..$iters {
                for x in &mut acc {
                    *x = $step(*x);
                }
            }
            acc
        }};
    }

    #[target_feature(enable = "avx512f")]
    fn fma512(iters: u64) -> i64 {
        let (a, b) = (_mm512_set1_ps(1.000_001), _mm512_set1_ps(0.999_999));
        let acc: [__m512; 16] = unrolled!(iters, _mm512_set1_ps(0.0), |x| _mm512_fmadd_ps(a, b, x));
        acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum::<f32>() as i64
    }

    #[target_feature(enable = "avx,fma")]
    fn fma256(iters: u64) -> i64 {
        let (a, b) = (_mm256_set1_ps(1.000_001), _mm256_set1_ps(0.999_999));
        let acc: [__m256; 16] = unrolled!(iters, _mm256_set1_ps(0.0), |x| _mm256_fmadd_ps(a, b, x));
        let lanes: [[f32; 8]; 16] = pulp::cast(acc);
        lanes.iter().flatten().sum::<f32>() as i64
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    fn dpbusd512(iters: u64) -> i64 {
        let (a, b) = (
            _mm512_set1_epi32(0x0101_0101),
            _mm512_set1_epi32(0x0202_0202),
        );
        let acc: [__m512i; 16] = unrolled!(iters, _mm512_set1_epi32(0), |x| _mm512_dpbusd_epi32(
            x, a, b
        ));
        let s = acc
            .iter()
            .fold(_mm512_set1_epi32(0), |s, &x| _mm512_add_epi32(s, x));
        i64::from(_mm512_reduce_add_epi32(s))
    }

    #[target_feature(enable = "avx2,avxvnni")]
    fn dpbusd256(iters: u64) -> i64 {
        let (a, b) = (
            _mm256_set1_epi32(0x0101_0101),
            _mm256_set1_epi32(0x0202_0202),
        );
        let acc: [__m256i; 16] = unrolled!(iters, _mm256_set1_epi32(0), |x| {
            _mm256_dpbusd_avx_epi32(x, a, b)
        });
        let lanes: [[i32; 8]; 16] = pulp::cast(acc);
        lanes.iter().flatten().map(|&v| i64::from(v)).sum()
    }

    #[target_feature(enable = "avx2")]
    fn maddwd256(iters: u64) -> i64 {
        let (a, b) = (
            _mm256_set1_epi32(0x0001_0001),
            _mm256_set1_epi32(0x0002_0002),
        );
        // Each product added on, as the kernel adds it.
        let acc: [__m256i; 16] = unrolled!(iters, _mm256_set1_epi32(0), |x| {
            _mm256_add_epi32(x, _mm256_madd_epi16(a, b))
        });
        let lanes: [[i32; 8]; 16] = pulp::cast(acc);
        lanes.iter().flatten().map(|&v| i64::from(v)).sum()
    }

    /// `instruction`'s rate, `macs` products each, run by `f`.
    fn measured(instruction: &'static str, macs: u32, f: fn(u64) -> i64) -> PeakRate {
        PeakRate {
            instruction,
            macs_per_s: rate(macs, f),
        }
    }

    pub(super) fn measure(path: CpuPath) -> Peak {
        let v3 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        // SAFETY (each call below): the CPU reported every feature the
        // function is compiled for, checked on the line that picks it.
        #[allow(unsafe_code)]
        let f32 = if is_x86_feature_detected!("avx512f") {
            Some(measured("vfmadd231ps zmm", 16, |n| unsafe { fma512(n) }))
        } else if v3 {
            Some(measured("vfmadd231ps ymm", 8, |n| unsafe { fma256(n) }))
        } else {
            None
        };
        #[allow(unsafe_code)]
        let int8 = if path >= CpuPath::Avx512 && v3 && CpuPath::has_avx512() {
            Some(measured("vpdpbusd zmm", 64, |n| unsafe { dpbusd512(n) }))
        } else if path >= CpuPath::Vnni && v3 && CpuPath::has_avx_vnni() {
            Some(measured("vpdpbusd ymm", 32, |n| unsafe { dpbusd256(n) }))
        } else if path >= CpuPath::Avx2 && v3 {
            Some(measured("vpmaddwd ymm", 16, |n| unsafe { maddwd256(n) }))
        } else {
            None
        };
        Peak { f32, int8 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prints the peaks of every path this CPU has. Not run by CI:
    /// `cargo test --release -p minions-engine --lib peak -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "a measurement: run with --release --ignored --nocapture"]
    fn peak() {
        for path in CpuPath::ALL.into_iter().filter(|p| *p <= CpuPath::best()) {
            let p = measure_peak(path);
            for (what, r) in [("f32", p.f32), ("int8", p.int8)] {
                if let Some(r) = r {
                    eprintln!(
                        "{}: {what} {} {:.1} GMAC/s",
                        path.name(),
                        r.instruction,
                        r.macs_per_s / 1e9
                    );
                }
            }
        }
    }
}
