//! The Minions watchdog: follows worker heartbeats, declares silent workers
//! dead and hands their shards back at once (whatever the ack wait), turns
//! shards JetStream gives up on into dead letters, and writes a manifest when
//! a job completes. It serves a live dashboard and Prometheus metrics.
//! Several may run at once: every write is compare-and-set or deduplicated,
//! so each action happens once.
//!
//! Layout:
//! - [`cli`] — flags.
//! - [`registry`] — the live view of workers and their state transitions.
//! - [`fleet`] — recording transitions (KV, compare-and-set) and hand-backs.
//! - [`dead_letters`] — max-deliveries advisories.
//! - [`tracker`] — the job tracker: dead-letter records and manifests, and the
//!   live progress of every job.
//! - [`checkpoint`] — saving and restoring the tracker's folded events, so a
//!   restart reads only the events stream's tail.
//! - [`events`] — following the events stream into the tracker.
//! - [`view`] — what the watchdog knows, shared with its web pages.
//! - [`queue`] — the work queue as JetStream reports it.
//! - [`explain`] — why a job's shards wait.
//! - [`groups`] — forming groups of workers for jobs split by layers.
//! - [`admission`], [`job_requests`] — admitting, cancelling and retrying
//!   jobs for producers' identities, one team at a time; [`reply`] — serving
//!   such requests.
//! - [`recent_actions`] — the last operator actions on record, for the dashboard.
//! - [`http`] — dashboard, JSON, `/metrics`, `/healthz`.
//! - [`ledger`] — jobs, deliveries and usage in PostgreSQL (`--ledger`).
//! - [`run`] — the loop.

pub mod admission;
pub mod checkpoint;
pub mod cli;
pub mod dead_letters;
pub mod events;
pub mod explain;
pub mod fleet;
pub mod groups;
pub mod http;
pub mod job_requests;
pub mod ledger;
pub mod orphans;
pub mod queue;
pub mod recent_actions;
pub mod registry;
pub mod reply;
pub mod run;
pub mod schedule;
pub mod tracker;
pub mod trust;
pub mod unheld;
pub mod view;

pub use run::{WatchdogConfig, WatchdogError, run};
