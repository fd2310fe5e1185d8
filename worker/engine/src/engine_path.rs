//! Which code a model runs on the CPU: our host kernels (the fast path), or
//! exactly the code it runs on Metal and CUDA, on candle's CPU backend (the
//! device path).
//!
//! Off the CPU a model always takes the device code: candle's products, the
//! padded attention layout, caches held as device tensors, candle's norms
//! and quantized matmul. No CPU-only machine would ever run that code, so
//! the device path exists to run it in tests and on any machine: the same
//! branches a GPU takes, on the CPU, where the fast path's answers are the
//! reference. `MINIONS_ENGINE_PATH=device` (or the worker's
//! `--engine-path device`) chooses it; a model is loaded on one path and
//! keeps it.

use candle_core::Device;
use minions_schemas::messages::Precision;

/// The environment variable that chooses the path ([`EnginePath::from_env`]).
pub const ENGINE_PATH_ENV: &str = "MINIONS_ENGINE_PATH";

/// The code a model on the CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EnginePath {
    /// Our CPU kernels on the CPU (packed attention, fused epilogues, int8
    /// and quantized products of our own); the device code elsewhere.
    #[default]
    Fast,
    /// The device code everywhere, the CPU included: what Metal and CUDA
    /// run, on candle's CPU backend.
    Device,
}

impl EnginePath {
    /// Each path's name and what it means, in the order `--help` lists them.
    pub const CHOICES: [(&str, &str); 2] = [
        (
            "fast",
            "Our CPU kernels on the CPU, the device code on a GPU (the default)",
        ),
        (
            "device",
            "The code Metal and CUDA run, everywhere: on the CPU through candle's CPU backend (for tests, and to check a GPU build's code on any machine)",
        ),
    ];

    /// The path [`ENGINE_PATH_ENV`] names; [`EnginePath::Fast`] when it is
    /// unset or empty; an error naming the variable for anything else.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(ENGINE_PATH_ENV) {
            Ok(v) if !v.trim().is_empty() => v
                .trim()
                .parse()
                .map_err(|e: String| format!("{ENGINE_PATH_ENV}: {e}")),
            _ => Ok(Self::Fast),
        }
    }

    /// Whether a model on `device` runs our host kernels (the fast path on
    /// the CPU) rather than the device code.
    pub fn host_kernels(self, device: &Device) -> bool {
        self == Self::Fast && device.is_cpu()
    }

    /// The precision a model asked to run in `precision` on `device` runs
    /// in: our host kernels have no faster f16 or bf16 product and run both
    /// as f32
    /// (bit for bit f32's vectors); everything else runs as asked. The one
    /// place this rule lives: the encoder's load and the worker's model
    /// cache (one warm copy for f32 and f16 jobs) both ask here.
    pub fn runs_as(self, device: &Device, precision: Precision) -> Precision {
        match precision {
            Precision::F16 | Precision::Bf16 if self.host_kernels(device) => Precision::F32,
            p => p,
        }
    }
}

impl std::str::FromStr for EnginePath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fast" => Ok(Self::Fast),
            "device" => Ok(Self::Device),
            _ => Err(format!("unknown engine path {s:?} (one of fast, device)")),
        }
    }
}

impl std::fmt::Display for EnginePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = match self {
            Self::Fast => 0,
            Self::Device => 1,
        };
        f.write_str(Self::CHOICES[i].0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_only_the_fast_path_on_the_cpu_takes_host_kernels() -> Result<(), String>
    {
        for (name, _) in EnginePath::CHOICES {
            assert_eq!(name.parse::<EnginePath>()?.to_string(), name);
        }
        assert!("gpu".parse::<EnginePath>().is_err());
        assert!(EnginePath::Fast.host_kernels(&Device::Cpu));
        assert!(!EnginePath::Device.host_kernels(&Device::Cpu));
        Ok(())
    }

    #[test]
    fn only_our_kernels_run_half_precisions_as_f32() {
        let cpu = Device::Cpu;
        assert_eq!(
            EnginePath::Fast.runs_as(&cpu, Precision::F16),
            Precision::F32
        );
        for p in [Precision::F16, Precision::Bf16] {
            assert_eq!(EnginePath::Fast.runs_as(&cpu, p), Precision::F32);
            assert_eq!(EnginePath::Device.runs_as(&cpu, p), p);
        }
        for p in [Precision::F32, Precision::Int8] {
            assert_eq!(EnginePath::Fast.runs_as(&cpu, p), p);
        }
    }
}
