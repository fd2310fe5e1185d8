//! Where a worker's energy figures come from.

use std::fmt;

/// The meter behind a worker's energy figures, as the wire names it
/// (`Energy::source`, `PowerReading::source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Linux RAPL package counters (Intel, and AMD Zen through the same
    /// interface): the CPU packages' energy, measured.
    Rapl,
    /// `nvidia-smi`: the GPU's energy counter, or its power draw integrated
    /// over time; measured.
    NvidiaSmi,
    /// macOS `powermetrics` (root only): CPU and GPU power integrated over
    /// each sample; measured.
    Powermetrics,
    /// A power figure for the device kind times the time shards run: not
    /// measured (see [`super::estimate`]).
    Estimate,
}

impl Source {
    /// The name on the wire: `rapl`, `nvidia-smi`, `powermetrics`, `estimate`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rapl => "rapl",
            Self::NvidiaSmi => "nvidia-smi",
            Self::Powermetrics => "powermetrics",
            Self::Estimate => "estimate",
        }
    }

    /// Whether the figures are read from a meter (false: estimated).
    pub fn measured(self) -> bool {
        !matches!(self, Self::Estimate)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_wire_names() {
        assert_eq!(Source::Rapl.name(), "rapl");
        assert_eq!(Source::NvidiaSmi.to_string(), "nvidia-smi");
        assert_eq!(Source::Powermetrics.name(), "powermetrics");
        assert_eq!(Source::Estimate.name(), "estimate");
        assert!(Source::Rapl.measured());
        assert!(!Source::Estimate.measured());
    }
}
