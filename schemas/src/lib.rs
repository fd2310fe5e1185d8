//! The Minions wire contract.
//!
//! Every other crate speaks through this one: the message types that cross NATS
//! and object storage (versioned MessagePack), the subject, stream, consumer and
//! bucket names with their settings, the object-key layout and the size limits
//! that every decode of untrusted bytes is held to.
//!
//! Layout:
//! - [`canary`] — the known shard every worker runs before it pulls work,
//!   its known answer, and how an answer is judged.
//! - [`ids`] — validated identifiers (job, worker, model names and hashes); every
//!   subject and object key is built only from these.
//! - [`codec`] — MessagePack encode/decode with a size limit, a depth limit and a
//!   schema-version check, returning typed errors.
//! - [`messages`] — job spec, shard task, shard event, heartbeat, control, shard
//!   input/output documents and the model manifest.
//! - [`subjects`] — subject names and message ids.
//! - [`streams`] — JetStream stream and bucket names and the work settings.
//! - [`scheduling`] — job consumers (names, metadata) and the rule by which a
//!   worker's free slot picks a job.
//! - [`progress`] — a job's progress, folded from its events.
//! - [`keys`] — the object-store key layout.
//! - [`limits`] — size limits for every decoded document.
//! - [`stage_frames`] — a split model's passes cut into checksummed parts
//!   and put together again.
//!
//! This crate does no I/O: connecting to NATS, creating the streams, the
//! object store, the ledger, config files and logging are in
//! `minions-endpoints` (`schemas/endpoints/`), so that the inference engine
//! depends on the contract alone.

pub mod access;
pub mod canary;
pub mod codec;
pub mod ids;
pub mod keys;
pub mod limits;
pub mod messages;
pub mod progress;
pub mod scheduling;
pub mod stage_frames;
pub mod streams;
pub mod subjects;
pub mod time;

pub use codec::{CodecError, decode, encode};
pub use ids::{IdError, JobId, ModelHash, ModelName, WorkerId};

/// The schema version this build writes and the only one it reads.
///
/// Bumped whenever a message changes shape in a way older readers cannot
/// ignore; readers refuse any other version with a clear error.
pub const SCHEMA_VERSION: u16 = 1;
