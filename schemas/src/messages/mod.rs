//! Message and document types. Every one has a `v` field (schema version)
//! and is encoded with [`crate::encode`] and decoded with [`crate::decode`]
//! under the limit named beside it.

mod action;
mod admission;
mod canary;
mod control;
mod dead_letter;
mod generation;
mod group;
mod heartbeat;
mod job_manifest;
mod job_request;
mod job_spec;
#[cfg(test)]
pub(crate) use job_spec::test_spec;
#[doc(hidden)]
pub use job_spec::test_spec_of;
mod model;
mod provenance;
mod quarantine;
mod schedule;
mod shard_event;
mod shard_io;
mod shard_task;
mod speech;
mod stage;
mod worker_record;

pub use action::{ActionKind, OperatorAction};
pub use admission::{Admission, SubmitClaim};
pub use canary::{CanaryAnswer, CanaryReport, CanaryVerdict};
pub use control::{Control, ControlCommand, ControlReply};
pub use dead_letter::DeadLetter;
pub use generation::{
    ChatTurn, FinishReason, Generation, GenerationRecord, Prompt, SamplingParams,
};
pub use group::{GroupAnswer, GroupMember, GroupOrder, HeldStage};
pub use heartbeat::{Heartbeat, InFlight, PowerReading};
pub use job_manifest::{JobManifest, ManifestShard};
pub use job_request::{JobAction, JobAnswer, JobRequest};
pub use job_spec::{DEFAULT_TEAM, InputDescription, JobSpec};
pub use model::{MODEL_CHUNK_BYTES, ModelFamily, ModelFile, ModelManifest, ModelRecord, Precision};
pub use provenance::{DEVICE_PATH_KERNEL, Provenance};
pub use quarantine::Quarantine;
pub use schedule::{Priority, QueuedJob, Requirements, Schedule, TeamPolicy, TeamShare};
pub use shard_event::{
    CLI_SENDER, Energy, EventKind, Sender, ShardEvent, VerdictOutcome, WATCHDOG_HOST,
};
pub use shard_io::{OutputPayload, ShardCheckpoint, ShardInput, ShardOutput};
pub use shard_task::ShardTask;
pub use speech::{
    AudioRecord, PartialTranscription, SpeechOptions, SpeechTask, TokenSegment, TranscriptSegment,
    Transcription,
};
pub use stage::{StageOpen, StagePass, StageReply, StageStep};
pub use worker_record::{WorkerRecord, WorkerState};
