//! Asking the heartbeat loop for a beat before its interval is up: now (a
//! shard started, a hold changed: the fleet must learn of it at once) or
//! soon (a shard finished: its slot shows free, and the next start, usually
//! right behind, rides the same beat). Requests coalesce.

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

/// The heartbeat loop's two doorbells.
#[derive(Default)]
pub(crate) struct Beats {
    now: Notify,
    soon: Notify,
}

impl Beats {
    /// Asks for a beat now.
    pub(crate) fn ask_now(&self) {
        self.now.notify_one();
    }

    /// Asks for a beat shortly.
    pub(crate) fn ask_soon(&self) {
        self.soon.notify_one();
    }

    /// Resolves when a beat is asked for now (the heartbeat loop waits on it).
    pub(crate) fn asked_now(&self) -> Notified<'_> {
        self.now.notified()
    }

    /// Resolves when a beat is asked for shortly.
    pub(crate) fn asked_soon(&self) -> Notified<'_> {
        self.soon.notified()
    }
}
