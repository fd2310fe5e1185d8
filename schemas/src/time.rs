//! Wall-clock timestamps as carried in messages.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, as stored in every message's time fields.
///
/// A clock before 1970 reads as 0 rather than failing: timestamps are for
/// people and rates, never for correctness.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
