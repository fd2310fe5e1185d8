//! The Minions worker: lends this machine's GPU to the fleet.
//!
//! It pulls from the job consumer the schedule picks, no more shards than it
//! has free slots, keeps running shards alive with in-progress
//! acks, runs them on candle (Metal on macOS, CUDA, or the CPU), writes each
//! output create-only to the store, publishes a shard event and only then
//! acks. Failures are settled by kind (see [`error::Settle`]).
//!
//! Layout:
//! - [`cli`] / [`config`] — flags and the configuration they build.
//! - [`run`] — connect, pull loop with bounded slots, drain on shutdown.
//! - `canary`: the known shard run before any work, and its verdict.
//! - [`doctor`] — what this machine brings and what stands in the way.
//! - [`service`] — the service files (systemd unit, launchd plist);
//!   [`install`] — install and start one, and report the worker's canary;
//!   [`start_record`] — how the last start came out.
//! - `context`: what the slots share, in parts with one owner each:
//!   `identity` (who this worker is), `settings` (how it runs shards),
//!   `holds` (what keeps it from pulling), `running` (the shards it runs),
//!   `beats` (asking for an early heartbeat) and `schedule` (which job a
//!   free slot pulls from, fed by `follow_schedule`).
//! - `shard`: one delivery from message to settlement; `events`: its
//!   events.
//! - [`generation`] — generation shards: continuous batching, checkpoints;
//!   `shared_run`: the one running batch that shards of a model join.
//! - `group`: this worker's part in a model split over a group (the first
//!   stage leads; later stages serve their layers); `group_part`: that
//!   part as the slots and the heartbeat see it.
//! - `heartbeat`: the periodic sign of life (and the last one on leaving).
//! - `control`: drain, resume, evict, rejoin requests and job cancellations.
//! - [`error`] — failure kinds and how each is settled.
//! - [`model`] — the model cache; the `Model` trait and the families
//!   themselves live in the `minions-engine` crate (`worker/engine/`).
//! - [`owner`] — owner signals, the lending policy, yield and resume.
//! - [`energy`] — the energy meters, each delivery's share, the
//!   heartbeat's power.

mod beats;
mod canary;
mod cancel_marker;
mod chip;
pub mod cli;
pub mod config;
mod context;
mod control;
pub mod doctor;
pub mod energy;
pub mod error;
mod events;
pub mod fault;
mod follow_schedule;
pub mod generation;
mod group;
mod group_part;
mod heartbeat;
mod holds;
mod identity;
pub mod install;
#[cfg(test)]
mod layout;
mod lock;
pub mod model;
pub mod owner;
pub mod pace;
mod pack;
pub mod process_env;
mod provenance;
mod quarantine;
pub mod run;
mod running;
mod schedule;
pub mod service;
mod settings;
mod shard;
mod shared_run;
mod speech;
pub mod start_record;
mod worker_error;

pub use config::WorkerConfig;
pub use run::{RunSummary, run};
pub use worker_error::WorkerError;
