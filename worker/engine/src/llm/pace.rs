//! How fast a stage runs its layers: time per layer per token over the
//! passes it ran, shared with the heartbeat so the watchdog can give a
//! faster machine more layers when it forms the next group.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Time a stage spent on its layers, and the layer-tokens it ran.
#[derive(Debug, Default)]
pub struct Pace {
    busy_ns: AtomicU64,
    layer_tokens: AtomicU64,
}

impl Pace {
    /// Counts a pass of `tokens` rows through `layers` layers that took
    /// `took`.
    pub fn record(&self, took: Duration, layers: usize, tokens: u64) {
        let work = (layers as u64).saturating_mul(tokens);
        if work == 0 {
            return;
        }
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
        self.layer_tokens.fetch_add(work, Ordering::Relaxed);
    }

    /// Mean nanoseconds per layer per token so far, at least 1 once
    /// anything ran (0: nothing measured yet).
    pub fn ns_per_layer_token(&self) -> u32 {
        let work = self.layer_tokens.load(Ordering::Relaxed);
        if work == 0 {
            return 0;
        }
        let ns = self.busy_ns.load(Ordering::Relaxed) / work;
        u32::try_from(ns).unwrap_or(u32::MAX).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_is_time_per_layer_token() {
        let p = Pace::default();
        assert_eq!(p.ns_per_layer_token(), 0);
        p.record(Duration::from_micros(300), 15, 10);
        p.record(Duration::from_micros(300), 15, 10);
        assert_eq!(p.ns_per_layer_token(), 2000);
        p.record(Duration::from_secs(1), 15, 0);
        assert_eq!(p.ns_per_layer_token(), 2000, "an empty pass counts nothing");
    }
}
