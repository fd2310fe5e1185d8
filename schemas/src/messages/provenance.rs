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
    pub kernel: String,
}

impl std::fmt::Display for Provenance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {} ({})", self.build, self.device, self.kernel)
    }
}
