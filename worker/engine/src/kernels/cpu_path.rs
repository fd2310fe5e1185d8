//! Which instruction path the CPU kernels take, picked at run time: machines
//! of one kind differ in their CPUs, so a binary built once must use what
//! the CPU it runs on has, never what the build machine had.
//!
//! The paths, each a superset of the one before: the portable path (plain
//! Rust, any CPU), AVX2 with FMA (x86-64-v3), and AVX2 with AVX-VNNI
//! (`vpdpbusd`: four byte products summed per lane in one instruction,
//! where AVX2 needs two). Every path computes the same bits; the tests force
//! each in turn. `MINIONS_CPU_PATH=portable|avx2|vnni` caps the path (to
//! compare them, or to rule one out); the CPU still decides what runs.

use std::sync::OnceLock;

/// An instruction path of the CPU kernels, from the most portable up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuPath {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2 and FMA (x86-64-v3).
    Avx2,
    /// AVX2, FMA and AVX-VNNI.
    Vnni,
}

/// The environment variable that caps the path.
pub const CPU_PATH_ENV: &str = "MINIONS_CPU_PATH";

impl CpuPath {
    /// The best path this CPU runs.
    pub fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if pulp::x86::V3::try_new().is_some() {
                if std::arch::is_x86_feature_detected!("avxvnni") {
                    return Self::Vnni;
                }
                return Self::Avx2;
            }
        }
        Self::Portable
    }

    /// The path the kernels take: the best this CPU runs, capped by
    /// [`CPU_PATH_ENV`] when it names one. Decided once per process.
    pub fn get() -> Self {
        static PATH: OnceLock<CpuPath> = OnceLock::new();
        *PATH.get_or_init(|| {
            let best = Self::best();
            match std::env::var(CPU_PATH_ENV) {
                Ok(v) => match Self::parse(&v) {
                    Some(cap) => best.min(cap),
                    None => {
                        tracing::warn!(value = %v, variable = CPU_PATH_ENV,
                            "unknown CPU path (portable, avx2 or vnni); using the best this CPU runs");
                        best
                    }
                },
                Err(_) => best,
            }
        })
    }

    /// The path named `s` (`portable`, `avx2`, `vnni`).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" => Some(Self::Portable),
            "avx2" => Some(Self::Avx2),
            "vnni" => Some(Self::Vnni),
            _ => None,
        }
    }

    /// Its name, as [`CpuPath::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Vnni => "vnni",
        }
    }

    /// One line for logs and `doctor`: the path taken, and the best the CPU
    /// has when a cap holds it lower.
    pub fn describe() -> String {
        let (now, best) = (Self::get(), Self::best());
        let what = match now {
            Self::Portable => "portable Rust",
            Self::Avx2 => "AVX2 + FMA",
            Self::Vnni => "AVX2 + FMA + AVX-VNNI",
        };
        if now == best {
            format!("{} ({what})", now.name())
        } else {
            format!(
                "{} ({what}; capped by {CPU_PATH_ENV}, the CPU has {})",
                now.name(),
                best.name()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_order_from_portable_up() {
        for p in [CpuPath::Portable, CpuPath::Avx2, CpuPath::Vnni] {
            assert_eq!(CpuPath::parse(p.name()), Some(p));
        }
        assert_eq!(CpuPath::parse(" AVX2 "), Some(CpuPath::Avx2));
        assert_eq!(CpuPath::parse("avx512"), None);
        assert!(CpuPath::Portable < CpuPath::Avx2 && CpuPath::Avx2 < CpuPath::Vnni);
        assert!(CpuPath::get() <= CpuPath::best());
    }
}
