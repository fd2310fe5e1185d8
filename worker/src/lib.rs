//! The Minions worker: lends this machine's GPU to the fleet.
//!
//! It shares one durable pull consumer with every other worker, pulls no more
//! shards than it has free slots, keeps running shards alive with in-progress
//! acks, runs them on candle (Metal on macOS, CUDA, or the CPU), writes each
//! output create-only to the store, publishes a shard event and only then
//! acks. Failures are settled by kind (see [`error::Settle`]).
//!
//! Layout:
//! - [`cli`] / [`config`] — flags and the configuration they build.
//! - [`run`] — connect, pull loop with bounded slots, drain on shutdown.
//! - `canary`: the known shard run before any work, and its verdict.
//! - [`doctor`] — what this machine brings and what stands in the way.
//! - [`service`] — install as a systemd user unit or launchd LaunchAgent.
//! - `shard`: one delivery from message to settlement.
//! - [`generation`] — generation shards: continuous batching, checkpoints.
//! - `heartbeat`: the periodic sign of life (and the last one on leaving).
//! - `control`: drain, resume, evict, rejoin requests and job cancellations.
//! - [`error`] — failure kinds and how each is settled.
//! - [`model`] — the model cache; the `Model` trait and the families
//!   themselves live in the `minions-engine` crate (`worker/engine/`).
//! - [`owner`] — owner signals, the lending policy, yield and resume.
//! - [`energy`] — the energy meters, each delivery's share, the
//!   heartbeat's power.

mod canary;
mod chip;
pub mod cli;
pub mod config;
mod context;
mod control;
pub mod doctor;
pub mod energy;
pub mod error;
pub mod fault;
pub mod generation;
mod heartbeat;
pub mod model;
pub mod owner;
pub mod process_env;
mod provenance;
mod quarantine;
pub mod run;
mod schedule;
pub mod service;
mod shard;

pub use config::WorkerConfig;
pub use run::{RunSummary, WorkerError, run};
