//! This CPU's peak for the two instructions the products live on, measured:
//! 512-bit f32 fused multiply-add (`vfmadd…ps zmm`) and 512-bit VNNI
//! (`vpdpbusd zmm`), sixteen independent accumulators per thread so that
//! latency never binds, on every core at once. The physical-limit line of
//! BENCHMARKS.md divides the products' achieved rates by these. Not run by
//! CI: `cargo test --release -p minions-engine --lib peak -- --ignored
//! --nocapture`.

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use crate::CpuPath;
    use std::arch::x86_64::{
        __m512, __m512i, _mm512_add_epi32, _mm512_add_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps,
        _mm512_reduce_add_epi32, _mm512_reduce_add_ps, _mm512_set1_epi32, _mm512_set1_ps,
    };
    use std::time::Instant;

    /// Iterations of sixteen instructions per thread.
    const ITERS: u64 = 50_000_000;

    #[target_feature(enable = "avx512f")]
    fn fma(iters: u64, seed: f32) -> f32 {
        let mut acc: [__m512; 16] = [_mm512_set1_ps(seed); 16];
        let (a, b) = (_mm512_set1_ps(1.000_001), _mm512_set1_ps(0.999_999));
        for _ in 0..iters {
            for x in &mut acc {
                *x = _mm512_fmadd_ps(a, b, *x);
            }
        }
        _mm512_reduce_add_ps(
            acc.iter()
                .fold(_mm512_set1_ps(0.0), |s, &x| _mm512_add_ps(s, x)),
        )
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    fn dpbusd(iters: u64, seed: i32) -> i32 {
        let mut acc: [__m512i; 16] = [_mm512_set1_epi32(seed); 16];
        let (a, b) = (
            _mm512_set1_epi32(0x0101_0101),
            _mm512_set1_epi32(0x0202_0202),
        );
        for _ in 0..iters {
            for x in &mut acc {
                *x = _mm512_dpbusd_epi32(*x, a, b);
            }
        }
        _mm512_reduce_add_epi32(
            acc.iter()
                .fold(_mm512_set1_epi32(0), |s, &x| _mm512_add_epi32(s, x)),
        )
    }

    /// Instructions per second with `threads` threads each running `f`.
    fn rate(threads: usize, f: fn(u64) -> i64) -> f64 {
        let t = Instant::now();
        let mut sink = 0i64;
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads).map(|_| s.spawn(|| f(ITERS))).collect();
            for h in hs {
                sink = sink.wrapping_add(h.join().unwrap_or_default());
            }
        });
        std::hint::black_box(sink);
        (ITERS * 16 * threads as u64) as f64 / t.elapsed().as_secs_f64()
    }

    #[test]
    #[ignore = "a measurement: run with --release --ignored --nocapture"]
    fn peak() {
        if !CpuPath::has_avx512() {
            eprintln!("no AVX-512 VNNI on this CPU");
            return;
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        // SAFETY: the CPU reported AVX-512 F and VNNI (`has_avx512`), all
        // the two functions are compiled for.
        #[allow(unsafe_code)]
        let (f, v) = (
            rate(threads, |n| unsafe { fma(n, 0.0) } as i64),
            rate(threads, |n| i64::from(unsafe { dpbusd(n, 0) })),
        );
        eprintln!(
            "{threads} threads: vfmadd zmm {:.2} G/s = {:.1} GFLOP/s (16 lanes × 2); \
             vpdpbusd zmm {:.2} G/s = {:.1} GMAC/s (64 byte products)",
            f / 1e9,
            f * 32.0 / 1e9,
            v / 1e9,
            v * 64.0 / 1e9
        );
    }
}
