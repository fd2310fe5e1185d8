//! Locking a mutex that a panicked holder may have poisoned.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the state over when an earlier holder panicked: every
/// holder in this crate changes the guarded state in one step, so it is
/// whole either way, and a worker keeps running rather than panic twice.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
