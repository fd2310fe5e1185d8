//! Message and document types. Every one has a `v` field (schema version)
//! and is encoded with [`crate::encode`] and decoded with [`crate::decode`]
//! under the limit named beside it.

mod control;
mod heartbeat;
mod job_spec;
mod model;
mod shard_event;
mod shard_io;
mod shard_task;

pub use control::{Control, ControlCommand};
pub use heartbeat::{Heartbeat, InFlight};
pub use job_spec::{InputDescription, JobSpec};
pub use model::{ModelFamily, ModelFile, ModelManifest, ModelRecord};
pub use shard_event::{EventKind, ShardEvent};
pub use shard_io::{OutputPayload, ShardInput, ShardOutput};
pub use shard_task::ShardTask;
