//! A sampled meter's counter between its samples.
//!
//! `nvidia-smi` runs every few seconds and `powermetrics` prints once a
//! second, but a delivery starts and ends at any moment and its share is
//! read right then. Between samples the counter is carried forward at the
//! last sample's power, for at most [`Track::new`]'s horizon; the next sample
//! puts it right. What it returns never goes back: a sample below what was
//! already returned (the carried-forward power was too high) holds the
//! counter until the real one passes it.

use std::time::{Duration, Instant};

/// One sample of a meter: its cumulative counter and power at a moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// When it was taken.
    pub at: Instant,
    /// The meter's cumulative energy, joules (from an arbitrary start).
    pub joules: f64,
    /// The power at that moment (or over the sample), watts.
    pub watts: f64,
}

/// A sampled counter, readable at any moment.
#[derive(Debug, Clone)]
pub struct Track {
    last: Option<Reading>,
    /// The most returned so far.
    reported: f64,
    horizon: Duration,
}

impl Track {
    /// A track that carries the last sample forward for at most `horizon`.
    pub fn new(horizon: Duration) -> Self {
        Self {
            last: None,
            reported: 0.0,
            horizon,
        }
    }

    /// Takes a new sample. A sample with a non-finite value is ignored.
    pub fn update(&mut self, r: Reading) {
        if r.joules.is_finite() && r.watts.is_finite() {
            self.last = Some(r);
        }
    }

    /// The counter at `now`; `None` before the first sample.
    pub fn read(&mut self, now: Instant) -> Option<f64> {
        let r = self.last?;
        let ahead = now.saturating_duration_since(r.at).min(self.horizon);
        let value = r.joules + r.watts.max(0.0) * ahead.as_secs_f64();
        self.reported = self.reported.max(value);
        Some(self.reported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_forward_and_never_goes_back() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut t = Track::new(s(3));
        assert_eq!(t.read(t0), None);
        t.update(Reading {
            at: t0,
            joules: 10.0,
            watts: 5.0,
        });
        assert_eq!(t.read(t0), Some(10.0));
        assert_eq!(t.read(t0 + s(1)), Some(15.0));
        // No further than the horizon.
        assert_eq!(t.read(t0 + s(10)), Some(25.0));
        // The real counter was lower: held until it passes.
        t.update(Reading {
            at: t0 + s(10),
            joules: 20.0,
            watts: 1.0,
        });
        assert_eq!(t.read(t0 + s(10)), Some(25.0));
        assert_eq!(t.read(t0 + s(12)), Some(25.0));
        t.update(Reading {
            at: t0 + s(13),
            joules: 30.0,
            watts: 1.0,
        });
        assert_eq!(t.read(t0 + s(13)), Some(30.0));
    }
}
