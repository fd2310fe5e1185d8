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
/// Wildcard for every worker's heartbeat.
pub const HEARTBEAT_ALL: &str = "minions.hb.>";

/// The subject a job's shard tasks are published on.
pub fn work(job: &JobId) -> String {
    format!("minions.work.{job}")
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
        assert_eq!(work(&j), "minions.work.j1");
        assert_eq!(event(&j, 7), "minions.events.j1.7");
        assert_eq!(msg_id(&j, 7), "j1/7");
        assert_eq!(heartbeat(&WorkerId::new("w1")?), "minions.hb.w1");
        Ok(())
    }
}
