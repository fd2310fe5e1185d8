//! Size limits applied before any untrusted bytes are decoded.
//!
//! Each limit is generous for honest use and small enough that a hostile
//! message cannot make a process allocate without bound.

/// A shard task message on the work stream (it carries ids, never data).
pub const MAX_TASK_BYTES: usize = 64 * 1024;
/// A shard event on the events stream.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// A worker heartbeat.
pub const MAX_HEARTBEAT_BYTES: usize = 256 * 1024;
/// A schedule (what is queued, team by team) that workers read.
pub const MAX_SCHEDULE_BYTES: usize = 4 * 1024 * 1024;
/// A team policy record.
pub const MAX_TEAM_POLICY_BYTES: usize = 4 * 1024;
/// A control message to a worker.
pub const MAX_CONTROL_BYTES: usize = 16 * 1024;
/// Largest quarantine record.
pub const MAX_QUARANTINE_BYTES: usize = 16 * 1024;
/// A canary report or verdict (a few kilobytes of vectors).
pub const MAX_CANARY_BYTES: usize = 256 * 1024;
/// A submit claim, a job request, or the reply to either (a job id, a
/// sentence).
pub const MAX_ADMISSION_BYTES: usize = 4 * 1024;
/// A job spec document in the store.
pub const MAX_SPEC_BYTES: usize = 1024 * 1024;
/// A model manifest or model name record in the store.
pub const MAX_MANIFEST_BYTES: usize = 1024 * 1024;
/// A job manifest in the store (a line per shard: about 200 bytes each).
pub const MAX_JOB_MANIFEST_BYTES: usize = 64 * 1024 * 1024;
/// One shard's input document in the store.
pub const MAX_SHARD_INPUT_BYTES: usize = 256 * 1024 * 1024;
/// One shard's output document in the store.
pub const MAX_SHARD_OUTPUT_BYTES: usize = 1024 * 1024 * 1024;
/// Deepest nesting of MessagePack containers accepted by [`crate::decode`].
pub const MAX_DEPTH: usize = 32;
/// Most records in one shard.
pub const MAX_SHARD_RECORDS: u32 = 1_000_000;
/// Longest single input record text, in bytes.
pub const MAX_TEXT_BYTES: usize = 1024 * 1024;
/// A watchdog's checkpoint of its folded event state in the store (it grows
/// with the shards of the jobs the events stream still holds: tens of bytes
/// a shard).
pub const MAX_WATCHDOG_CHECKPOINT_BYTES: usize = 1 << 31;
/// The header of a watchdog checkpoint (which stream sequence it covers).
pub const MAX_CHECKPOINT_HEADER_BYTES: usize = 64 * 1024;
/// An assembled [`crate::messages::StagePass`] or
/// [`crate::messages::StageReply`] (a pass of 2,048 tokens of a model
/// 8,192 wide is 64 MiB).
pub const MAX_STAGE_PASS_BYTES: usize = 96 * 1024 * 1024;
/// One part of a stage frame ([`crate::stage_frames`]), under NATS's
/// default 1 MiB payload.
pub const MAX_STAGE_PART_BYTES: usize = 1024 * 1024;
/// Largest audio file a speech job takes (submit refuses larger ones; a
/// worker fails such a file alone).
pub const MAX_AUDIO_BYTES: u64 = 1 << 30;
/// Largest list of audio files (a speech job's JSON Lines input).
pub const MAX_AUDIO_LIST_BYTES: u64 = 64 * 1024 * 1024;

/// The longest initial prompt of a speech record, in bytes (the model keeps
/// the prompt's last 223 tokens).
pub const MAX_INITIAL_PROMPT_BYTES: usize = 4096;
/// The most beams a speech record may ask for (`--beam-size`).
pub const MAX_SPEECH_BEAMS: u32 = 8;
/// The most temperatures a speech record's fallback may try.
pub const MAX_SPEECH_TEMPERATURES: usize = 10;
