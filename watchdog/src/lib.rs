//! The Minions watchdog: follows worker heartbeats and keeps a registry of
//! the fleet.
//!
//! Layout:
//! - [`cli`] — flags.
//! - [`registry`] — workers by id, joined and lost.
//! - [`run`] — the loop over heartbeats.

pub mod cli;
pub mod registry;
pub mod run;

pub use run::{WatchdogConfig, WatchdogError, run};
