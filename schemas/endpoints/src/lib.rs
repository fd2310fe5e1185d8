//! How every Minions program reaches the outside, for the contract in
//! `minions-schemas` (which holds no I/O of its own): NATS and its streams,
//! buckets and job consumers, object storage, the ledger's PostgreSQL, the
//! config file, logging, and the signals that ask a program to stop. The
//! inference engine does not depend on this crate.

pub mod actions;
pub mod admission;
pub mod config_file;
pub mod control;
pub mod exit;
pub mod follow;
pub mod host;
pub mod job_control;
pub mod ledger;
pub mod logging;
pub mod manifest;
pub mod nats;
pub mod queue;
pub mod resilient;
pub mod signals;
pub mod snapshot;
pub mod store;
pub mod streams;
pub mod usage;
