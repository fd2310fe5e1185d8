//! A pace switch for tests of scheduling and failover: a worker started
//! with `MINIONS_TEST_PACE=HASH:MS` holds its compute slot at least `MS`
//! milliseconds per record on embedding shards of the model whose hash is
//! `HASH`, waiting after the compute as a slower machine would. Such shards
//! last seconds while the cores rest, so the several workers of one test do
//! not take the cores from every other test of the run. The wait ends at
//! once when the shard is handed back or cancelled, as a compute does.
//! Off unless a test sets it; a worker that has it on says so at start.

use std::time::Duration;

/// The environment variable that turns the switch on.
pub const PACE_VAR: &str = "MINIONS_TEST_PACE";

/// The longest pace the switch accepts per record (a value past it is a
/// mistake, not a test).
const MAX_PER_RECORD_MS: u64 = 10_000;

/// The switch as this process reads it: one model, a time per record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pace {
    model_hash: String,
    per_record: Duration,
}

impl Pace {
    /// The switch from the environment; `None` when unset. A value that is
    /// not `HASH:MS` leaves the worker at its own pace, with a warning.
    pub(crate) fn from_env() -> Option<Self> {
        let v = std::env::var(PACE_VAR).ok()?;
        let parsed = Self::parse(&v);
        if parsed.is_none() {
            tracing::warn!(variable = PACE_VAR, value = %v,
                "not MODEL_HASH:MS_PER_RECORD: the pace switch stays off");
        }
        parsed
    }

    fn parse(v: &str) -> Option<Self> {
        let (hash, ms) = v.trim().rsplit_once(':')?;
        let ms: u64 = ms.parse().ok()?;
        if hash.is_empty() || ms == 0 || ms > MAX_PER_RECORD_MS {
            return None;
        }
        Some(Self {
            model_hash: hash.to_owned(),
            per_record: Duration::from_millis(ms),
        })
    }

    /// How long a shard of `rows` records of `model_hash` lasts at least;
    /// `None` for every other model.
    pub(crate) fn for_shard(&self, model_hash: &str, rows: usize) -> Option<Duration> {
        (model_hash == self.model_hash).then(|| {
            self.per_record
                .saturating_mul(u32::try_from(rows).unwrap_or(u32::MAX))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pace_applies_to_its_model_only() {
        let p = Pace::parse("ab12:7").unwrap_or_else(|| panic!("not parsed"));
        assert_eq!(p.for_shard("ab12", 3), Some(Duration::from_millis(21)));
        assert_eq!(p.for_shard("cd34", 3), None);
    }

    #[test]
    fn malformed_values_leave_the_switch_off() {
        for v in ["", "ab12", ":5", "ab12:0", "ab12:x", "ab12:99999999"] {
            assert_eq!(Pace::parse(v), None, "{v:?}");
        }
    }
}
