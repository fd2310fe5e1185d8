//! Which instruction path the CPU kernels take, picked at run time: machines
//! of one kind differ in their CPUs, so a binary built once must use what
//! the CPU it runs on has, never what the build machine had.
//!
//! The paths, from the most portable up: plain Rust (any CPU), AVX2 with
//! FMA (x86-64-v3), AVX2 with AVX-VNNI (`vpdpbusd`: four byte products
//! summed per lane in one instruction, where AVX2 needs two), and AVX-512
//! with its VNNI (the same at twice the width). Every path computes the
//! same bits; the tests force each in turn.
//! `MINIONS_CPU_PATH=portable|avx2|vnni|avx512` caps the path (to compare
//! them, or to rule one out); the CPU still decides what runs. A CPU may
//! have AVX-512 VNNI without AVX-VNNI (Ice Lake, Cascade Lake): a kernel
//! asked for `vnni` there takes its AVX2 form ([`CpuPath::has_avx_vnni`]).

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
    /// AVX-512 F, BW, VL and VNNI, with AVX2 and FMA.
    Avx512,
}

/// The environment variable that caps the path.
pub const CPU_PATH_ENV: &str = "MINIONS_CPU_PATH";

impl CpuPath {
    /// Every path, from the most portable up.
    pub const ALL: [Self; 4] = [Self::Portable, Self::Avx2, Self::Vnni, Self::Avx512];

    /// The best path this CPU runs.
    pub fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if pulp::x86::V3::try_new().is_some() {
                if Self::has_avx512() {
                    return Self::Avx512;
                }
                if Self::has_avx_vnni() {
                    return Self::Vnni;
                }
                return Self::Avx2;
            }
        }
        Self::Portable
    }

    /// Whether the CPU has what the AVX-512 path uses: AVX-512 F, BW, VL
    /// and VNNI.
    pub fn has_avx512() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Whether the CPU has AVX-VNNI (the 256-bit, VEX-encoded form).
    pub fn has_avx_vnni() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avxvnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
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
                            "unknown CPU path (portable, avx2, vnni or avx512); using the best this CPU runs");
                        best
                    }
                },
                Err(_) => best,
            }
        })
    }

    /// The path named `s` (`portable`, `avx2`, `vnni`, `avx512`).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" => Some(Self::Portable),
            "avx2" => Some(Self::Avx2),
            "vnni" => Some(Self::Vnni),
            "avx512" => Some(Self::Avx512),
            _ => None,
        }
    }

    /// Its name, as [`CpuPath::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Vnni => "vnni",
            Self::Avx512 => "avx512",
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
            Self::Avx512 => "AVX-512 + AVX-512 VNNI",
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
        for p in CpuPath::ALL {
            assert_eq!(CpuPath::parse(p.name()), Some(p));
        }
        assert_eq!(CpuPath::parse(" AVX2 "), Some(CpuPath::Avx2));
        assert_eq!(CpuPath::parse("avx512f"), None);
        assert!(CpuPath::ALL.is_sorted() && CpuPath::ALL.len() == 4);
        assert!(CpuPath::get() <= CpuPath::best());
    }
}
