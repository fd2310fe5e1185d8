//! What keeps a worker from pulling: an operator's drain or eviction, its
//! owner's return (the owner policy), and the fleet's quarantine. Pulling
//! goes on only while none holds; every change is told to the fleet at
//! once through a beat.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::beats::Beats;
use crate::lock::lock;

/// The three holds and whether the worker may pull; changed only through
/// the setters below, which keep `pulling` in step.
pub(crate) struct Holds {
    /// True while no hold is set.
    pulling: watch::Sender<bool>,
    operator: Mutex<bool>,
    owner: Mutex<Option<String>>,
    quarantine: Mutex<Option<String>>,
    beats: Arc<Beats>,
}

impl Holds {
    /// No hold set: the worker pulls. Changes ring `beats`.
    pub(crate) fn new(beats: Arc<Beats>) -> Self {
        Self {
            pulling: watch::Sender::new(true),
            operator: Mutex::new(false),
            owner: Mutex::new(None),
            quarantine: Mutex::new(None),
            beats,
        }
    }

    /// True while some hold keeps the worker from pulling.
    pub(crate) fn draining(&self) -> bool {
        !*self.pulling.borrow()
    }

    /// Follows whether the worker may pull (true: no hold).
    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.pulling.subscribe()
    }

    fn refresh(&self) {
        let held = *lock(&self.operator)
            || lock(&self.owner).is_some()
            || lock(&self.quarantine).is_some();
        let changed = self.pulling.send_if_modified(|p| {
            let changed = *p == held;
            *p = !held;
            changed
        });
        if changed {
            // The fleet learns of a yield or a drain at once.
            self.beats.ask_now();
        }
    }

    /// Sets or clears an operator's hold (drain, evict / resume).
    pub(crate) fn set_operator(&self, hold: bool) {
        *lock(&self.operator) = hold;
        self.refresh();
    }

    /// Sets or clears the owner policy's hold, with its reason.
    pub(crate) fn set_owner(&self, reason: Option<String>) {
        *lock(&self.owner) = reason;
        self.refresh();
    }

    /// Sets or clears the quarantine hold, with its reason; true when it
    /// changed (set where it was clear, or cleared where it was set).
    pub(crate) fn set_quarantine(&self, reason: Option<String>) -> bool {
        let changed = {
            let mut q = lock(&self.quarantine);
            let changed = q.is_some() != reason.is_some();
            *q = reason;
            changed
        };
        self.refresh();
        changed
    }

    /// The owner state as heartbeats report it.
    pub(crate) fn owner_state(&self) -> String {
        match &*lock(&self.owner) {
            None => "available".to_owned(),
            Some(reason) => format!("yielded: {reason}"),
        }
    }

    /// Why a hold hands running shards back, the weightiest first
    /// (quarantine, owner, operator); `None` without a hold.
    pub(crate) fn reason(&self) -> Option<String> {
        if let Some(reason) = &*lock(&self.quarantine) {
            Some(format!("quarantined: {reason}"))
        } else if let Some(reason) = &*lock(&self.owner) {
            Some(format!("owner: {reason}"))
        } else if *lock(&self.operator) {
            Some("evicted by an operator".to_owned())
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulling_stops_while_any_hold_is_set_and_the_weightiest_reason_wins() {
        let holds = Holds::new(Arc::new(Beats::default()));
        assert!(!holds.draining());
        assert_eq!(holds.reason(), None);
        holds.set_operator(true);
        assert!(holds.draining());
        assert_eq!(holds.reason().as_deref(), Some("evicted by an operator"));
        holds.set_owner(Some("input 0 s ago".to_owned()));
        assert_eq!(holds.reason().as_deref(), Some("owner: input 0 s ago"));
        assert_eq!(holds.owner_state(), "yielded: input 0 s ago");
        assert!(holds.set_quarantine(Some("outvoted".to_owned())));
        assert!(!holds.set_quarantine(Some("outvoted again".to_owned())));
        assert_eq!(
            holds.reason().as_deref(),
            Some("quarantined: outvoted again")
        );
        holds.set_operator(false);
        holds.set_owner(None);
        assert!(holds.draining(), "the quarantine still holds");
        assert!(holds.set_quarantine(None));
        assert!(!holds.draining());
        assert_eq!(holds.owner_state(), "available");
    }

    #[test]
    fn a_change_asks_for_a_beat_at_once() {
        let beats = Arc::new(Beats::default());
        let holds = Holds::new(beats.clone());
        let mut rx = holds.subscribe();
        holds.set_owner(Some("back".to_owned()));
        assert!(rx.has_changed().unwrap_or(false));
        assert!(!*rx.borrow_and_update());
        // The beat was asked for: a permit is stored, so this resolves.
        let asked = beats.asked_now();
        futures::executor::block_on(asked);
    }
}
