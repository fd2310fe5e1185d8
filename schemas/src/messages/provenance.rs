//! What made a shard's output: the worker's build, its device and its CPU
//! kernel path. Outputs, done events and job manifests carry it, so that a
//! wrong result can be traced to the build, device or kernels behind it.

use serde::{Deserialize, Serialize};

/// What made an output, besides the worker (named beside it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Provenance {
    /// The worker build: its version and the first 12 hex digits of the
    /// SHA-256 of its executable, e.g. `0.1.0+3fa2c81b09de` (two builds of
    /// one version differ).
    pub build: String,
    /// The compute device, e.g. `cpu`, `metal:0`, `cuda:0`.
    pub device: String,
    /// The CPU kernel path (`portable`, `avx2`, `vnni`, `avx512`); it
    /// matters on `cpu` and for the CPU-side work of the other devices.
    /// `device` on the CPU means the device path: candle's code, as a GPU
    /// runs it, rather than our CPU kernels.
    pub kernel: String,
}

/// [`Provenance::kernel`] on the device path (`MINIONS_ENGINE_PATH=device`).
pub const DEVICE_PATH_KERNEL: &str = "device";

impl Provenance {
    /// Whether outputs made by `self` and `other` come from the same
    /// arithmetic, so that they can be asked to agree bit for bit: every
    /// CPU kernel path computes the same bits, so any two makers on `cpu`
    /// with our kernels do; otherwise only the same device and kernel
    /// path do (two GPUs, or a GPU and a CPU, sum in different orders and
    /// quantise int8 differently).
    pub fn same_arithmetic(&self, other: &Self) -> bool {
        let ours = |p: &Self| p.device == "cpu" && p.kernel != DEVICE_PATH_KERNEL;
        (ours(self) && ours(other)) || (self.device == other.device && self.kernel == other.kernel)
    }
}

impl std::fmt::Display for Provenance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {} ({})", self.build, self.device, self.kernel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(device: &str, kernel: &str) -> Provenance {
        Provenance {
            build: "0.1.0".into(),
            device: device.into(),
            kernel: kernel.into(),
        }
    }

    #[test]
    fn cpu_kernel_paths_share_arithmetic_devices_do_not() {
        assert!(made("cpu", "avx2").same_arithmetic(&made("cpu", "avx512")));
        assert!(!made("cpu", "avx2").same_arithmetic(&made("cpu", DEVICE_PATH_KERNEL)));
        assert!(!made("cpu", "avx2").same_arithmetic(&made("cuda:0", "avx2")));
        assert!(made("cuda:0", "avx2").same_arithmetic(&made("cuda:0", "avx2")));
        assert!(!made("metal:0", "portable").same_arithmetic(&made("cuda:0", "portable")));
    }
}
