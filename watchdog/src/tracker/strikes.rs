//! Strikes: results of a machine that a majority of check runs outvoted,
//! each counted once per (job, shard) and forgotten once it is older than
//! the fleet's expiry (`--strikes-expire-hours`), so that a machine is
//! quarantined for errors that are recent, and the record stays small over
//! months.

use std::collections::BTreeMap;

use minions_schemas::JobId;
use serde::{Deserialize, Serialize};

/// How long a strike counts unless the watchdog is told otherwise: a week.
pub const DEFAULT_EXPIRE_HOURS: u64 = 24 * 7;

/// One result a majority outvoted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Strike {
    /// The job of the result.
    pub job: JobId,
    /// Its shard.
    pub shard: u32,
    /// When the verdict was made (ms since the epoch).
    pub at_ms: u64,
}

/// Strikes per machine; saved in checkpoints as a map of named records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Strikes(BTreeMap<String, Vec<Strike>>);

impl Strikes {
    /// Counts a strike against `machine`; false when its result of this
    /// shard was counted already.
    pub fn add(&mut self, machine: &str, job: &JobId, shard: u32, at_ms: u64) -> bool {
        let list = self.0.entry(machine.to_owned()).or_default();
        if list.iter().any(|s| s.job == *job && s.shard == shard) {
            return false;
        }
        list.push(Strike {
            job: job.clone(),
            shard,
            at_ms,
        });
        true
    }

    /// Forgets the strikes made before `before_ms`; returns how many.
    pub fn expire(&mut self, before_ms: u64) -> usize {
        let mut gone = 0;
        self.0.retain(|_, list| {
            let n = list.len();
            list.retain(|s| s.at_ms >= before_ms);
            gone += n - list.len();
            !list.is_empty()
        });
        gone
    }

    /// The strikes against `machine` made after `since_ms` (its release by
    /// an operator; 0 for none).
    pub fn since(&self, machine: &str, since_ms: u64) -> u32 {
        self.0.get(machine).map_or(0, |l| {
            u32::try_from(l.iter().filter(|s| s.at_ms > since_ms).count()).unwrap_or(u32::MAX)
        })
    }

    /// Strikes held, all machines together.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strikes_count_once_per_shard_and_expire() -> Result<(), Box<dyn std::error::Error>> {
        let (a, b) = (JobId::new("a")?, JobId::new("b")?);
        let mut s = Strikes::default();
        assert!(s.add("m1", &a, 1, 1_000));
        assert!(!s.add("m1", &a, 1, 2_000), "the same result counted twice");
        assert!(s.add("m1", &a, 2, 5_000));
        assert!(s.add("m1", &b, 1, 9_000));
        assert!(s.add("m2", &a, 1, 1_000));
        assert_eq!((s.since("m1", 0), s.since("m2", 0), s.len()), (3, 1, 4));
        // A release at 5 s: only later strikes count toward another quarantine.
        assert_eq!(s.since("m1", 5_000), 1);
        // Strikes before 5 s expire; a machine with none left is forgotten.
        assert_eq!(s.expire(5_000), 2);
        assert_eq!((s.since("m1", 0), s.since("m2", 0), s.len()), (2, 0, 2));
        assert_eq!(s.0.len(), 1);
        Ok(())
    }
}
