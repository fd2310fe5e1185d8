//! Fleet-wide counters for `/metrics`, kept as events are folded. Counts
//! shard outcomes once per shard (a duplicate delivery's second `done` is
//! not a second shard), so they match the jobs' own totals.

use serde::{Deserialize, Serialize};

/// Upper bounds (seconds) of the shard-duration histogram's buckets.
pub const DURATION_BOUNDS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// A histogram with fixed bounds; `counts[i]` counts observations in bucket
/// `i` alone (not cumulative), the last slot holds those above every bound.
#[derive(Debug, Clone, Serialize)]
pub struct Histogram {
    /// Upper bounds, ascending.
    pub bounds: &'static [f64],
    /// Per-bucket counts; one more than `bounds` (the +Inf bucket).
    pub counts: Vec<u64>,
    /// Sum of all observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds`.
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    /// Cumulative counts per bound, then +Inf (the Prometheus form).
    pub fn cumulative(&self) -> Vec<u64> {
        self.counts
            .iter()
            .scan(0u64, |acc, c| {
                *acc += c;
                Some(*acc)
            })
            .collect()
    }
}

/// What the fleet has done, as the events tell it.
#[derive(Debug, Clone, Serialize)]
pub struct Counters {
    /// Shards done (each once).
    pub done: u64,
    /// Shards failed for good (each once); each has a dead-letter record.
    pub failed: u64,
    /// Deliveries that failed and will be retried.
    pub retried: u64,
    /// Deliveries handed back unfinished, for any reason.
    pub handed_back: u64,
    /// Hand-backs because a machine's owner came back.
    pub owner_handbacks: u64,
    /// Records embedded (of shards done).
    pub records: u64,
    /// Tokens generated (of generation shards done).
    pub tokens: u64,
    /// Milliseconds of audio transcribed (of speech shards done).
    pub audio_ms: u64,
    /// Deliveries beyond a shard's first.
    pub redeliveries: u64,
    /// Results rejected by a watchdog: `done` events that their output
    /// does not back (forged or corrupt); each such shard runs again.
    pub rejected: u64,
    /// Shards whose result a check run on another machine confirmed, or a
    /// majority of three decided.
    pub verified: u64,
    /// Check runs that disagreed with the result they checked.
    pub disagreements: u64,
    /// Results outvoted by a majority (a strike against their machine).
    pub outvoted: u64,
    /// Wall time of shards done, seconds.
    pub durations: Histogram,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            done: 0,
            failed: 0,
            retried: 0,
            handed_back: 0,
            owner_handbacks: 0,
            records: 0,
            tokens: 0,
            audio_ms: 0,
            redeliveries: 0,
            rejected: 0,
            verified: 0,
            disagreements: 0,
            outvoted: 0,
            durations: Histogram::new(&DURATION_BOUNDS),
        }
    }
}

/// [`Counters`] as a checkpoint holds them (the same fields as they
/// serialize, with the histogram's bounds owned).
#[derive(Deserialize)]
struct SavedCounters {
    done: u64,
    failed: u64,
    retried: u64,
    handed_back: u64,
    owner_handbacks: u64,
    records: u64,
    tokens: u64,
    #[serde(default)]
    audio_ms: u64,
    redeliveries: u64,
    #[serde(default)]
    rejected: u64,
    #[serde(default)]
    verified: u64,
    #[serde(default)]
    disagreements: u64,
    #[serde(default)]
    outvoted: u64,
    durations: SavedHistogram,
}

#[derive(Deserialize)]
struct SavedHistogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl<'de> Deserialize<'de> for Counters {
    /// Refuses a duration histogram whose bounds are not
    /// [`DURATION_BOUNDS`] or whose counts do not fit them.
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        let s = SavedCounters::deserialize(de)?;
        let h = s.durations;
        if h.bounds != DURATION_BOUNDS || h.counts.len() != DURATION_BOUNDS.len() + 1 {
            return Err(serde::de::Error::custom(
                "the saved duration histogram has other buckets than this build",
            ));
        }
        Ok(Self {
            done: s.done,
            failed: s.failed,
            retried: s.retried,
            handed_back: s.handed_back,
            owner_handbacks: s.owner_handbacks,
            records: s.records,
            tokens: s.tokens,
            audio_ms: s.audio_ms,
            redeliveries: s.redeliveries,
            rejected: s.rejected,
            verified: s.verified,
            disagreements: s.disagreements,
            outvoted: s.outvoted,
            durations: Histogram {
                bounds: &DURATION_BOUNDS,
                counts: h.counts,
                sum: h.sum,
                count: h.count,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_in_inf() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 9.0] {
            h.observe(v);
        }
        assert_eq!(h.counts, vec![2, 1, 1]);
        assert_eq!(h.cumulative(), vec![2, 3, 4]);
        assert_eq!(h.count, 4);
        assert!((h.sum - 12.0).abs() < 1e-9);
    }
}
