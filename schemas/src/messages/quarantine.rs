use serde::{Deserialize, Serialize};

/// A machine's entry in the quarantine bucket
/// ([`crate::streams::QUARANTINE_BUCKET`], key = machine name). A watchdog
/// writes it when the machine's results lost to the majority of check runs
/// too often; an operator's `minions worker release` rewrites it with
/// `quarantined` false. A worker whose machine is quarantined pulls nothing.
/// Limit: [`crate::limits::MAX_QUARANTINE_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantine {
    /// Schema version.
    pub v: u16,
    /// The machine (the part of worker ids before the last `-`).
    pub machine: String,
    /// Whether it is quarantined now (false: released by an operator).
    pub quarantined: bool,
    /// Strikes counted against the machine when this was written. After a
    /// release, a watchdog counts only strikes made after `at_ms` toward
    /// another quarantine.
    pub strikes: u32,
    /// Why, in words (the last strike's job and shard, or who released it).
    pub reason: String,
    /// Who wrote it: a watchdog's name, or the operator.
    pub by: String,
    /// When (ms since the epoch).
    pub at_ms: u64,
}
