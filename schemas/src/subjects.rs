//! Subject names and message ids.
//!
//! Subjects are built only from validated ids, so no token can carry `.`, `*`
//! or `>` into a subject.

use crate::ids::{JobId, WorkerId};

/// Prefix of every Minions subject.
pub const PREFIX: &str = "minions";

/// Subjects captured by the work stream.
pub const WORK_SUBJECTS: &str = "minions.work.>";
/// Subjects captured by the events stream.
pub const EVENT_SUBJECTS: &str = "minions.events.>";
/// Wildcard for every worker's heartbeat (captured by the heartbeat stream).
pub const HEARTBEAT_ALL: &str = "minions.hb.>";
/// Subjects captured by the dead-letter stream.
pub const DEAD_SUBJECTS: &str = "minions.dead.>";
/// Wildcard for job cancellations (core NATS, every worker listens).
pub const CANCEL_ALL: &str = "minions.cancel.>";

/// The advisory JetStream publishes when a message of `stream` reached the
/// max deliveries of `consumer`.
pub fn max_deliveries_advisory(stream: &str, consumer: &str) -> String {
    format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}")
}

/// The advisory JetStream publishes when a consumer terminates a message.
pub fn terminated_advisory(stream: &str, consumer: &str) -> String {
    format!("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{stream}.{consumer}")
}

/// The dead-letter subject of one shard.
pub fn dead(job: &JobId, shard: u32) -> String {
    format!("minions.dead.{job}.{shard}")
}

/// Filter for one job's dead letters.
pub fn job_dead(job: &JobId) -> String {
    format!("minions.dead.{job}.>")
}

/// The subject that tells workers a job was cancelled.
pub fn cancel(job: &JobId) -> String {
    format!("minions.cancel.{job}")
}

/// The subject one shard's task is published on. One subject per shard lets
/// anyone ask whether a shard is queued (last message by subject) and lets a
/// job's pending shards be purged by filter.
pub fn work(job: &JobId, shard: u32) -> String {
    format!("minions.work.{job}.{shard}")
}

/// Filter for all of one job's shard tasks.
pub fn job_work(job: &JobId) -> String {
    format!("minions.work.{job}.>")
}

/// The subject of one shard's events (started, done, failed).
pub fn event(job: &JobId, shard: u32) -> String {
    format!("minions.events.{job}.{shard}")
}

/// Filter for all events of one job.
pub fn job_events(job: &JobId) -> String {
    format!("minions.events.{job}.>")
}

/// The subject a worker publishes its heartbeat on.
pub fn heartbeat(worker: &WorkerId) -> String {
    format!("minions.hb.{worker}")
}

/// The subject a worker listens on for control messages (drain, evict).
pub fn control(worker: &WorkerId) -> String {
    format!("minions.ctl.{worker}")
}

/// The `Nats-Msg-Id` of a shard task: `job/shard`, so that publishing the same
/// shard twice inside the stream's duplicate window stores it once.
pub fn msg_id(job: &JobId, shard: u32) -> String {
    format!("{job}/{shard}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_built_from_ids() -> Result<(), crate::IdError> {
        let j = JobId::new("j1")?;
        assert_eq!(work(&j, 7), "minions.work.j1.7");
        assert_eq!(job_work(&j), "minions.work.j1.>");
        assert_eq!(event(&j, 7), "minions.events.j1.7");
        assert_eq!(msg_id(&j, 7), "j1/7");
        assert_eq!(heartbeat(&WorkerId::new("w1")?), "minions.hb.w1");
        Ok(())
    }
}
