//! The Minions watchdog: follows worker heartbeats, declares silent workers
//! dead and hands their shards back at once (whatever the ack wait), turns
//! shards JetStream gives up on into dead letters, and writes a manifest when
//! a job completes. Several may run at once: every write is compare-and-set
//! or deduplicated, so each action happens once.
//!
//! Layout:
//! - [`cli`] — flags.
//! - [`registry`] — the live view of workers and their state transitions.
//! - [`fleet`] — recording transitions (KV, compare-and-set) and hand-backs.
//! - [`dead_letters`] — max-deliveries advisories.
//! - [`jobs`] — the job tracker: dead-letter records and manifests.
//! - [`run`] — the loop.

pub mod cli;
pub mod dead_letters;
pub mod fleet;
pub mod jobs;
pub mod registry;
pub mod run;

pub use run::{WatchdogConfig, WatchdogError, run};
