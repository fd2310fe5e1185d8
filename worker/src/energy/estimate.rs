//! The estimate: a power figure for the device kind, times the time during
//! which at least one shard runs. Used when no meter can be read; always
//! reported with `measured: false` and source `estimate`.
//!
//! Idle draws nothing in the estimate: the figure is what the device adds
//! while it works, and the worker claims no energy while it holds no shard
//! (a metered machine's heartbeat does count its idle draw).
//!
//! The figures, and where they come from (each is a round number near the
//! public specifications below; `--power-watts` replaces it with a figure
//! known for the machine):
//!
//! - `cpu`: [`CPU_WATTS_PER_CORE`] (7 W) per busy core, times the threads
//!   candle computes with (one per physical core, or `RAYON_NUM_THREADS`).
//!   Desktop CPUs' sustained power per core: AMD Ryzen 9 7950X 170 W TDP /
//!   16 cores = 10.6 W; Ryzen 7 7700 65 W / 8 = 8.1 W; Intel Core i5-13400
//!   65 W base power / 10 cores = 6.5 W; Core i7-13700 65 W / 16 = 4.1 W.
//!   On Apple Silicon [`APPLE_CPU_WATTS_PER_CORE`] (5 W) per performance
//!   core: Apple's power page for the Mac mini gives 6.8 W idle and 39 W at
//!   most for the whole M1 model (4 performance cores), CPU and GPU flat
//!   out, measured at the wall (tabled at
//!   daringfireball.net/2021/01/mac_mini_power_consumption).
//! - `metal`: [`METAL_WATTS`] (20 W), the Apple GPU working with the CPU
//!   feeding it. Apple's figures for whole machines at full load, from the
//!   wall: M1 Mac mini 39 W (above); Mac Studio M1 Max 115 W, M1 Ultra
//!   215 W, M2 Max 145 W (support.apple.com/102027). The base and Pro chips
//!   that office Macs carry sit at the low end.
//! - `cuda`: [`CUDA_WATTS`] (200 W). NVIDIA's total graphics power: RTX
//!   3060 170 W, RTX 4070 200 W, RTX 4090 450 W; data-centre T4 70 W and L4
//!   72 W. Inference rarely holds a board at its limit.

use std::time::Instant;

/// Watts per busy CPU core (see the module's notes).
pub const CPU_WATTS_PER_CORE: f64 = 7.0;
/// Watts per busy performance core of Apple Silicon.
pub const APPLE_CPU_WATTS_PER_CORE: f64 = 5.0;
/// Watts of a busy Apple GPU (`metal` devices).
pub const METAL_WATTS: f64 = 20.0;
/// Watts of a busy NVIDIA GPU (`cuda` devices).
pub const CUDA_WATTS: f64 = 200.0;

/// The power the estimate uses and how it was arrived at.
#[derive(Debug, Clone, PartialEq)]
pub struct PowerModel {
    /// Watts while at least one shard runs; finite and ≥ 0.
    pub watts: f64,
    /// How the figure was arrived at, for logs and `doctor`.
    pub basis: String,
}

impl PowerModel {
    /// The figure for `device` (`cpu`, `metal:N`, `cuda:N`): `power_watts`
    /// when given (`--power-watts`), else the device kind's figure; `cpu`
    /// counts `threads` busy cores, of `apple_silicon` kind or not.
    pub fn for_device(
        device: &str,
        power_watts: Option<f64>,
        threads: usize,
        apple_silicon: bool,
    ) -> Self {
        if let Some(w) = power_watts.filter(|w| w.is_finite() && *w >= 0.0) {
            return Self {
                watts: w,
                basis: format!("{w} W while a shard runs (--power-watts)"),
            };
        }
        let kind = device.split(':').next().unwrap_or(device);
        match kind {
            "cuda" => Self {
                watts: CUDA_WATTS,
                basis: format!(
                    "{CUDA_WATTS} W while a shard runs (a typical NVIDIA board's; --power-watts sets the figure)"
                ),
            },
            "metal" => Self {
                watts: METAL_WATTS,
                basis: format!(
                    "{METAL_WATTS} W while a shard runs (a typical Apple GPU's; --power-watts sets the figure)"
                ),
            },
            _ => {
                let threads = threads.max(1);
                let per = if apple_silicon {
                    APPLE_CPU_WATTS_PER_CORE
                } else {
                    CPU_WATTS_PER_CORE
                };
                let watts = per * threads as f64;
                Self {
                    watts,
                    basis: format!(
                        "{per} W per busy core × {threads} cores = {watts} W while a shard runs (--power-watts sets the figure)"
                    ),
                }
            }
        }
    }

    /// The figure for `device` on this machine: the threads candle
    /// computes with, and whether this is Apple Silicon.
    pub fn here(device: &str, power_watts: Option<f64>) -> Self {
        Self::for_device(
            device,
            power_watts,
            candle_core::utils::get_num_threads(),
            cfg!(all(target_os = "macos", target_arch = "aarch64")),
        )
    }
}

/// The estimate as a cumulative counter: watts times the time during which
/// a delivery was open, joules.
#[derive(Debug, Clone)]
pub struct Estimate {
    watts: f64,
    joules: f64,
    last: Option<Instant>,
}

impl Estimate {
    /// A counter at 0 that adds `watts` while busy.
    pub fn new(watts: f64) -> Self {
        Self {
            watts: if watts.is_finite() {
                watts.max(0.0)
            } else {
                0.0
            },
            joules: 0.0,
            last: None,
        }
    }

    /// The watts it adds while busy.
    pub fn watts(&self) -> f64 {
        self.watts
    }

    /// The counter at `now`, where `busy` says whether a delivery was open
    /// all the time since the previous read (the caller reads at every
    /// begin and end, so it is all or nothing).
    pub fn read(&mut self, now: Instant, busy: bool) -> f64 {
        if let Some(last) = self.last
            && busy
        {
            self.joules += self.watts * now.saturating_duration_since(last).as_secs_f64();
        }
        self.last = Some(now);
        self.joules
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn figures_by_device_kind() {
        let cpu = PowerModel::for_device("cpu", None, 8, false);
        assert_eq!(cpu.watts, 56.0);
        assert!(cpu.basis.contains("8 cores"), "{}", cpu.basis);
        assert_eq!(PowerModel::for_device("cpu", None, 4, true).watts, 20.0);
        assert_eq!(PowerModel::for_device("cpu", None, 0, false).watts, 7.0);
        assert_eq!(PowerModel::for_device("metal:0", None, 8, true).watts, 20.0);
        assert_eq!(
            PowerModel::for_device("cuda:1", None, 8, false).watts,
            200.0
        );
    }

    #[test]
    fn the_flag_overrides() {
        let m = PowerModel::for_device("cuda:0", Some(65.0), 8, false);
        assert_eq!(m.watts, 65.0);
        assert!(m.basis.contains("--power-watts"));
        // Nonsense is ignored (the flag's own check refuses it first).
        assert_eq!(
            PowerModel::for_device("cpu", Some(f64::NAN), 2, false).watts,
            14.0
        );
        assert_eq!(
            PowerModel::for_device("cpu", Some(-1.0), 2, false).watts,
            14.0
        );
    }

    #[test]
    fn counts_only_busy_time() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut e = Estimate::new(10.0);
        assert_eq!(e.read(t0, false), 0.0);
        assert_eq!(e.read(t0 + s(5), false), 0.0); // idle: nothing
        assert_eq!(e.read(t0 + s(7), true), 20.0); // 2 s busy
        assert_eq!(e.read(t0 + s(8), false), 20.0);
        assert_eq!(e.read(t0 + s(8) + Duration::from_millis(500), true), 25.0);
    }
}
