//! Subject names and message ids.
//!
//! Subjects are built only from validated ids, so no token can carry `.`, `*`
//! or `>` into a subject.

use crate::ids::{JobId, WorkerId};
use crate::messages::Priority;

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
/// The schedule the watchdog publishes (core NATS, every worker listens).
pub const SCHEDULE: &str = "minions.sched";
/// Told when a job's shards were just queued (core NATS, best effort; the
/// payload is the job id): schedulers read the queue at once instead of at
/// their next tick, so a new job starts within milliseconds.
pub const QUEUED: &str = "minions.queued";
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

/// Filter for all of one job's work messages: its shard tasks and its
/// check runs (purges and counts use it).
pub fn job_work(job: &JobId) -> String {
    format!("minions.work.{job}.>")
}

/// Filter for one job's shard tasks only (its consumer's filter; one token
/// after the job, so it does not overlap [`job_checks`]).
pub fn job_shards(job: &JobId) -> String {
    format!("minions.work.{job}.*")
}

/// The subject a check run of one shard is queued on (any round): beside
/// the job's shards in the work stream, under a consumer of its own so that
/// workers pull checks ahead of the job's remaining shards.
pub fn check_work(job: &JobId, shard: u32) -> String {
    format!("minions.work.{job}.check.{shard}")
}

/// Filter for one job's check runs (its check consumer's filter).
pub fn job_checks(job: &JobId) -> String {
    format!("minions.work.{job}.check.*")
}

/// The subject of one shard's events (started, done, failed) sent by
/// `sender`: its last token is the sender's [`machine`], so that a NATS
/// identity can be allowed to speak for its own machine only. Readers drop
/// events whose subject is not the one their sender would use
/// ([`crate::messages::ShardEvent::is_on`]).
pub fn event(job: &JobId, shard: u32, sender: &WorkerId) -> String {
    format!("minions.events.{job}.{shard}.{}", machine(sender))
}

/// The subjects of every job's `submitted` event (shard 0, sent by the
/// command line): one per job, what `minions jobs` lists.
pub const SUBMITTED_EVENTS: &str = "minions.events.*.0.cli";

/// The machine part of a worker id: what precedes its last `-` (workers add
/// `-` and a random suffix to their `--name` or host name), or the whole id.
/// Heartbeat, control and event subjects carry it as a token of its own, and
/// a per-machine NATS identity is granted only subjects under its token
/// (`minions admin add-worker`).
pub fn machine(worker: &WorkerId) -> &str {
    let id = worker.as_str();
    match id.rfind('-') {
        Some(i) if i > 0 => &id[..i],
        _ => id,
    }
}

/// Filter for all events of one job.
pub fn job_events(job: &JobId) -> String {
    format!("minions.events.{job}.>")
}

/// The subject a worker publishes its heartbeat on:
/// `minions.hb.<machine>.<worker>`. The watchdog ignores a heartbeat whose
/// subject is not its worker's, and the machine token lets the server refuse
/// a heartbeat sent under another machine's workers.
pub fn heartbeat(worker: &WorkerId) -> String {
    format!("minions.hb.{}.{worker}", machine(worker))
}

/// Whether `subject` is exactly `tokens` joined by `.` (no allocation).
fn is_tokens(subject: &str, tokens: &[&str]) -> bool {
    let mut it = subject.split('.');
    tokens.iter().all(|t| it.next() == Some(*t)) && it.next().is_none()
}

/// Whether `subject` is [`heartbeat`]`(worker)`, without building it: the
/// watchdog checks this on every heartbeat.
pub fn is_heartbeat_of(subject: &str, worker: &WorkerId) -> bool {
    is_tokens(
        subject,
        &["minions", "hb", machine(worker), worker.as_str()],
    )
}

/// Whether `subject` is [`event`]`(job, shard, sender)`, without building
/// it: readers check this on every event.
pub fn is_event_of(subject: &str, job: &JobId, shard: u32, sender: &WorkerId) -> bool {
    let mut it = subject.split('.');
    let shard_ok = |t: Option<&str>| {
        t.is_some_and(|t| (t == "0" || !t.starts_with('0')) && t.parse::<u32>() == Ok(shard))
    };
    it.next() == Some("minions")
        && it.next() == Some("events")
        && it.next() == Some(job.as_str())
        && shard_ok(it.next())
        && it.next() == Some(machine(sender))
        && it.next().is_none()
}

/// The subject a worker listens on for control messages (drain, evict):
/// `minions.ctl.<machine>.<worker>`.
pub fn control(worker: &WorkerId) -> String {
    format!("minions.ctl.{}.{worker}", machine(worker))
}

/// Where a watchdog sends one worker its part in a group
/// ([`crate::messages::GroupOrder`], request and reply):
/// `minions.group.<machine>.<worker>`.
pub fn group(worker: &WorkerId) -> String {
    format!("minions.group.{}.{worker}", machine(worker))
}

/// Where a stage of a group takes passes from the stage before it:
/// `minions.stage.<machine>.<worker>.in`.
pub fn stage_in(worker: &WorkerId) -> String {
    format!("minions.stage.{}.{worker}.in", machine(worker))
}

/// Where a group's first stage takes the last stage's replies:
/// `minions.stage.<machine>.<worker>.back`.
pub fn stage_back(worker: &WorkerId) -> String {
    format!("minions.stage.{}.{worker}.back", machine(worker))
}

/// Where a worker sends its canary answers, under its own machine name:
/// `minions.canary.<machine>`. A watchdog answers (one of a queue group).
pub fn canary(worker: &WorkerId) -> String {
    format!("minions.canary.{}", machine(worker))
}

/// Where a producer asks the watchdogs to admit a job:
/// `minions.submit.<team>.<priority>.<submitter>` (the submitter as
/// [`submitter_token`] writes it). The server config entry of a producer
/// identity allows exactly its teams, priorities and name here, so a
/// watchdog takes them from the subject (see
/// [`crate::messages::SubmitClaim`]). `team` must be a valid id (no `.`).
pub fn submit(team: &str, priority: Priority, submitter: &str) -> String {
    format!(
        "minions.submit.{team}.{}.{}",
        priority.as_str(),
        submitter_token(submitter)
    )
}

/// Where an operator action is put on record, under its actor's name
/// ([`submitter_token`]): `minions.actions.<actor>`. A server config grants
/// each identity its own name only (the watchdog every name: it records
/// what the dashboard's users do under theirs). Readers drop a record whose
/// `by` is not its subject's actor.
pub fn action(actor: &str) -> String {
    format!("minions.actions.{}", submitter_token(actor))
}

/// Every action subject (the actions stream's).
pub const ACTION_SUBJECTS: &str = "minions.actions.>";

/// The queue group the watchdogs share on the subjects one of them
/// answers (canaries, submit claims).
pub const WATCHDOG_GROUP: &str = "minions-watchdogs";

/// Every submit subject, for the watchdogs' queue group.
pub const SUBMIT_ALL: &str = "minions.submit.>";

/// A submitter's name as one subject token: characters other than ASCII
/// letters, digits, `-`, `_` and `@` become `_`; at most 64 of them.
pub fn submitter_token(name: &str) -> String {
    let token: String = name
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_@".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if token.is_empty() { "_".into() } else { token }
}

/// The team, priority and submitter token a submit subject names, if it
/// is one.
pub fn parse_submit(subject: &str) -> Option<(&str, Priority, &str)> {
    let mut it = subject.split('.');
    if it.next() != Some("minions") || it.next() != Some("submit") {
        return None;
    }
    let team = it
        .next()
        .filter(|t| crate::ids::validate("team", t).is_ok())?;
    let priority = Priority::parse(it.next()?)?;
    // Only what [`submitter_token`] writes.
    let submitter = it.next().filter(|s| submitter_token(s) == *s)?;
    it.next().is_none().then_some((team, priority, submitter))
}

/// Where a producer asks the watchdogs to cancel or retry a job it acts on
/// for `team`: `minions.jobreq.<team>.<submitter>` (the submitter as
/// [`submitter_token`] writes it). A producer identity's server config
/// entry allows its own teams and name here only; a watchdog acts only on
/// jobs of the team the subject names (see
/// [`crate::messages::JobRequest`]). `team` must be a valid id (no `.`).
pub fn job_request(team: &str, submitter: &str) -> String {
    format!("minions.jobreq.{team}.{}", submitter_token(submitter))
}

/// Every job request subject, for the watchdogs' queue group.
pub const JOB_REQUEST_ALL: &str = "minions.jobreq.>";

/// The team and submitter token a job request subject names, if it is one.
pub fn parse_job_request(subject: &str) -> Option<(&str, &str)> {
    let mut it = subject.split('.');
    if it.next() != Some("minions") || it.next() != Some("jobreq") {
        return None;
    }
    let team = it
        .next()
        .filter(|t| crate::ids::validate("team", t).is_ok())?;
    let submitter = it.next().filter(|s| submitter_token(s) == *s)?;
    it.next().is_none().then_some((team, submitter))
}

/// Every machine's canary subject, for the watchdogs' queue group.
pub const CANARY_ALL: &str = "minions.canary.*";

/// The machine a canary subject names, if it is one.
pub fn canary_machine(subject: &str) -> Option<&str> {
    subject
        .strip_prefix("minions.canary.")
        .filter(|m| !m.is_empty() && !m.contains('.'))
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
    fn a_job_request_subject_names_team_and_submitter() {
        let s = job_request("alpha", "ana@corp.example");
        assert_eq!(s, "minions.jobreq.alpha.ana@corp_example");
        assert_eq!(parse_job_request(&s), Some(("alpha", "ana@corp_example")));
        for bad in [
            "minions.jobreq.alpha",
            "minions.jobreq.alpha.ana.x",
            "minions.jobreq.al pha.ana",
            "minions.submit.alpha.ana",
            "minions.jobreq.alpha.a b",
        ] {
            assert_eq!(parse_job_request(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_submit_subject_names_team_priority_and_submitter() {
        let s = submit("alpha", Priority::High, "ana@laptop.local");
        assert_eq!(s, "minions.submit.alpha.high.ana@laptop_local");
        assert_eq!(
            parse_submit(&s),
            Some(("alpha", Priority::High, "ana@laptop_local"))
        );
        for bad in [
            "minions.submit.alpha.urgent.ana",
            "minions.submit.alpha.high",
            "minions.submit.alpha.high.ana.x",
            "minions.submit..high.ana",
            "minions.canary.alpha.high.ana",
            "minions.submit.alpha.high.a\u{13}b",
        ] {
            assert_eq!(parse_submit(bad), None, "{bad}");
        }
        assert_eq!(submitter_token(""), "_");
        assert_eq!(submitter_token("a.b*c>d e"), "a_b_c_d_e");
    }

    #[test]
    fn subjects_are_built_from_ids() -> Result<(), crate::IdError> {
        let j = JobId::new("j1")?;
        assert_eq!(work(&j, 7), "minions.work.j1.7");
        assert_eq!(job_work(&j), "minions.work.j1.>");
        assert_eq!(job_shards(&j), "minions.work.j1.*");
        assert_eq!(check_work(&j, 7), "minions.work.j1.check.7");
        assert_eq!(job_checks(&j), "minions.work.j1.check.*");
        let w = WorkerId::new("mac-01-3f9a2b7c")?;
        assert_eq!(event(&j, 7, &w), "minions.events.j1.7.mac-01");
        assert_eq!(msg_id(&j, 7), "j1/7");
        assert_eq!(heartbeat(&WorkerId::new("w1")?), "minions.hb.w1.w1");
        assert_eq!(heartbeat(&w), "minions.hb.mac-01.mac-01-3f9a2b7c");
        assert_eq!(control(&w), "minions.ctl.mac-01.mac-01-3f9a2b7c");
        assert_eq!(group(&w), "minions.group.mac-01.mac-01-3f9a2b7c");
        assert_eq!(stage_in(&w), "minions.stage.mac-01.mac-01-3f9a2b7c.in");
        assert_eq!(stage_back(&w), "minions.stage.mac-01.mac-01-3f9a2b7c.back");
        Ok(())
    }

    #[test]
    fn checks_agree_with_the_built_subjects() -> Result<(), crate::IdError> {
        let (j, w) = (JobId::new("j1")?, WorkerId::new("mac-01-3f9a2b7c")?);
        let other = WorkerId::new("mac-02-3f9a2b7c")?;
        assert!(is_heartbeat_of(&heartbeat(&w), &w));
        assert!(!is_heartbeat_of(&heartbeat(&other), &w));
        assert!(!is_heartbeat_of(&format!("{}.x", heartbeat(&w)), &w));
        assert!(!is_heartbeat_of("minions.hb.mac-01", &w));
        for s in [0, 7, 10, u32::MAX] {
            assert!(is_event_of(&event(&j, s, &w), &j, s, &w));
            assert!(!is_event_of(&event(&j, s, &other), &j, s, &w));
            assert!(!is_event_of(&event(&j, s.wrapping_add(1), &w), &j, s, &w));
        }
        assert!(!is_event_of("minions.events.j1.07.mac-01", &j, 7, &w));
        assert!(!is_event_of("minions.events.j1.7", &j, 7, &w));
        assert!(!is_event_of("minions.events.j1.7.mac-01.x", &j, 7, &w));
        Ok(())
    }

    #[test]
    fn the_machine_is_the_id_before_its_suffix() -> Result<(), crate::IdError> {
        assert_eq!(machine(&WorkerId::new("ann-s-mbp-0a1b2c3d")?), "ann-s-mbp");
        assert_eq!(machine(&WorkerId::new("cli")?), "cli");
        assert_eq!(machine(&WorkerId::new("w_1")?), "w_1");
        Ok(())
    }
}
