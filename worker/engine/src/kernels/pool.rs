//! Where a forward pass runs on the CPU: on a thread of the compute pool.
//!
//! Every kernel here splits its work with rayon. Called from a thread
//! outside the pool (the worker's blocking task, a bench's main thread),
//! each parallel loop is sent to the pool while the caller sleeps until it
//! ends: two thread wake-ups per product, and the caller never computes.
//! Decoding one token runs about 150 such loops, each a few microseconds of
//! work, so those wake-ups were much of the time. Run inside the pool, the
//! loops split by work-stealing, and the thread that started them computes
//! a share.

/// Runs `f`, a pass on `device`: on the CPU on a thread of rayon's global
/// pool (the one the kernels use), or right here when this thread is one
/// already; on other devices right here. Returns what `f` does.
pub(crate) fn in_pool<R: Send>(device: &candle_core::Device, f: impl FnOnce() -> R + Send) -> R {
    if device.is_cpu() {
        rayon::scope(|_| f())
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::in_pool;

    /// The closure runs on a pool thread, and nesting stays on it.
    #[test]
    fn runs_on_a_pool_thread() {
        assert!(rayon::current_thread_index().is_none());
        let cpu = candle_core::Device::Cpu;
        let inner = in_pool(&cpu, || {
            let outer = rayon::current_thread_index();
            (outer, in_pool(&cpu, rayon::current_thread_index))
        });
        assert!(inner.0.is_some());
        assert_eq!(inner.0, inner.1);
    }
}
