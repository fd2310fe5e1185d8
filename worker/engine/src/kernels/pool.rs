//! Where a forward pass runs: on the CPU on a thread of the compute pool,
//! on a GPU one pass at a time per device.
//!
//! Every kernel here splits its work with rayon. Called from a thread
//! outside the pool (the worker's blocking task, a bench's main thread),
//! each parallel loop is sent to the pool while the caller sleeps until it
//! ends: two thread wake-ups per product, and the caller never computes.
//! Decoding one token runs about 150 such loops, each a few microseconds of
//! work, so those wake-ups were much of the time. Run inside the pool, the
//! loops split by work-stealing, and the thread that started them computes
//! a share.

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::DeviceLocation;

/// Runs `f`, a pass on `device`: on the CPU on a thread of rayon's global
/// pool (the one the kernels use), or right here when this thread is one
/// already; on a GPU right here, one pass at a time per device (see
/// [`device_gate`]). Returns what `f` does.
pub(crate) fn in_pool<R: Send>(device: &candle_core::Device, f: impl FnOnce() -> R + Send) -> R {
    if device.is_cpu() {
        rayon::scope(|_| f())
    } else {
        let gate = device_gate(device.location());
        let _one_at_a_time = gate.lock().unwrap_or_else(PoisonError::into_inner);
        f()
    }
}

/// The lock that lets one pass at a time onto the GPU at `location`. A
/// worker's slots run shards side by side, each on its own thread; on a
/// GPU their passes would interleave their command buffers, which candle's
/// Metal backend handles badly (memory growth and stalls under many
/// concurrent passes: candle issues 2271, 3464), and which gains nothing
/// where one pass already fills the device. The CPU has no gate: its
/// passes share rayon's pool.
fn device_gate(location: DeviceLocation) -> Arc<Mutex<()>> {
    static GATES: Mutex<Vec<(DeviceLocation, Arc<Mutex<()>>)>> = Mutex::new(Vec::new());
    let mut gates = GATES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, gate)) = gates.iter().find(|(at, _)| *at == location) {
        return Arc::clone(gate);
    }
    let gate = Arc::new(Mutex::new(()));
    gates.push((location, Arc::clone(&gate)));
    gate
}

#[cfg(test)]
mod tests {
    use super::{device_gate, in_pool};
    use candle_core::DeviceLocation;

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

    /// One gate per device: the same for the same GPU, another for another.
    #[test]
    fn one_gate_per_device() {
        let a = DeviceLocation::Cuda { gpu_id: 0 };
        let b = DeviceLocation::Metal { gpu_id: 0 };
        assert!(std::sync::Arc::ptr_eq(&device_gate(a), &device_gate(a)));
        assert!(!std::sync::Arc::ptr_eq(&device_gate(a), &device_gate(b)));
        let held = device_gate(b);
        let _held = held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(
            device_gate(b).try_lock().is_err(),
            "a second pass got onto the device"
        );
        assert!(device_gate(a).try_lock().is_ok());
    }
}
