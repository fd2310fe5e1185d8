//! "Why is my shard not running?": the reasons a job's pending shards wait,
//! judged from the fleet, the queue and the job. Pure: the caller gathers
//! the facts, so every reason is tested without a fleet.

use minions_schemas::progress::Progress;
use serde::Serialize;

use crate::queue::QueueInfo;
use crate::view::WorkerRow;

/// One reason, with a stable key for scripts and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    /// Stable key: `ended`, `all_running`, `no_workers`, `all_owners_active`,
    /// `all_draining`, `model_too_large`, `no_free_slot`, `max_ack_pending`,
    /// `not_queued`, `queued_behind`, `retrying`, `queue_unreadable`,
    /// `starting`, `sharing`, `checks_wait`.
    pub key: &'static str,
    /// What a person can act on.
    pub text: String,
}

/// The facts about one job that the fleet view does not hold.
#[derive(Debug, Clone, Default)]
pub struct JobFacts {
    /// Its model's size, MB.
    pub model_mb: Option<u64>,
    /// The last failure that will be retried: shard and reason.
    pub last_retry: Option<(u32, String)>,
    /// Its messages in the work stream (None when unreadable).
    pub queued: Option<u64>,
    /// Why the fleet's sharing holds it back (fair share, priority, quota,
    /// preemptible, what it needs), from the schedule.
    pub sharing: Option<String>,
}

fn r(key: &'static str, text: String) -> Reason {
    Reason { key, text }
}

fn list<'a>(items: impl Iterator<Item = String> + 'a, max: usize) -> String {
    let all: Vec<String> = items.collect();
    let mut s = all.iter().take(max).cloned().collect::<Vec<_>>().join("; ");
    if all.len() > max {
        s.push_str(&format!("; and {} more", all.len() - max));
    }
    s
}

/// Why `job`'s pending shards are not running, most decisive first. Never
/// empty: when nothing blocks, says so.
pub fn explain(
    job: &Progress,
    facts: &JobFacts,
    workers: &[WorkerRow],
    queue: &QueueInfo,
) -> Vec<Reason> {
    let mut out = Vec::new();
    if job.state.is_final() {
        out.push(r(
            "ended",
            format!("the job is {}: nothing waits to run", job.state.as_str()),
        ));
        return out;
    }
    let machines: std::collections::BTreeSet<String> = workers
        .iter()
        .filter(|w| w.alive())
        .map(|w| {
            minions_schemas::WorkerId::new(&w.id).map_or_else(
                |_| w.id.clone(),
                |id| minions_schemas::subjects::machine(&id).to_owned(),
            )
        })
        .collect();
    if let Some(why) = job.checks_waiting(machines.len()) {
        out.push(r("checks_wait", why));
        if job.pending == 0 {
            return out;
        }
    }
    if job.pending == 0 {
        out.push(r(
            "all_running",
            format!(
                "no shard is waiting: the {} shards left are running",
                job.running
            ),
        ));
        return out;
    }
    let alive: Vec<&WorkerRow> = workers.iter().filter(|w| w.alive()).collect();
    let silent = workers
        .iter()
        .filter(|w| w.state == minions_schemas::messages::WorkerState::Suspect)
        .count();
    if alive.is_empty() {
        let mut text = "no worker is connected: start `minions-worker` on a machine with a GPU (or `minions dev` to try on this one)".to_owned();
        if silent > 0 {
            text.push_str(&format!(
                "; {silent} workers have gone silent and may be asleep"
            ));
        }
        out.push(r("no_workers", text));
        return out;
    }
    let yielded: Vec<&&WorkerRow> = alive.iter().filter(|w| !w.lending()).collect();
    let lending: Vec<&&WorkerRow> = alive
        .iter()
        .filter(|w| w.lending() && w.state != minions_schemas::messages::WorkerState::Draining)
        .collect();
    if lending.is_empty() {
        if !yielded.is_empty() {
            out.push(r(
                "all_owners_active",
                format!(
                    "every worker's owner is using the machine, so none takes work: {}",
                    list(
                        yielded.iter().map(|w| format!("{}: {}", w.host, w.owner)),
                        5
                    )
                ),
            ));
        }
        let draining = alive.len() - yielded.len();
        if draining > 0 {
            out.push(r(
                "all_draining",
                format!(
                    "{draining} workers are drained or evicted by an operator (`minions worker resume ID` lets them pull again)"
                ),
            ));
        }
        return out;
    }
    if let Some(why) = &facts.sharing {
        out.push(r("sharing", why.clone()));
    }
    let mut fits = lending.clone();
    if let Some(mb) = facts.model_mb {
        fits.retain(|w| w.mem_budget_mb == 0 || w.mem_budget_mb >= mb);
        if fits.is_empty() {
            let biggest = lending.iter().max_by_key(|w| w.mem_budget_mb);
            out.push(r(
                "model_too_large",
                format!(
                    "model {} needs about {mb} MB and no available machine lends that much{}",
                    job.model,
                    biggest.map_or(String::new(), |w| format!(
                        " (the most is {} MB on {})",
                        w.mem_budget_mb, w.host
                    ))
                ),
            ));
        }
    }
    if !fits.is_empty() {
        let slots: u64 = fits.iter().map(|w| u64::from(w.slots)).sum();
        let used: u64 = fits.iter().map(|w| w.running.len() as u64).sum();
        if used >= slots {
            out.push(r(
                "no_free_slot",
                format!(
                    "all {slots} slots of the {} available workers are busy; shards start as others finish",
                    fits.len()
                ),
            ));
        }
    }
    if queue.ok && queue.max_ack_pending > 0 && queue.ack_pending >= queue.max_ack_pending {
        out.push(r(
            "max_ack_pending",
            format!(
                "JetStream's limit of {} unacknowledged deliveries is reached, so it delivers nothing more until some are acknowledged (raise max_ack_pending of consumer minions-workers)",
                queue.max_ack_pending
            ),
        ));
    }
    match facts.queued {
        Some(q) if q < u64::from(job.pending) + u64::from(job.running) => {
            let lost = u64::from(job.pending) + u64::from(job.running) - q;
            out.push(r(
                "not_queued",
                format!(
                    "{lost} of the job's waiting shards are not in the work queue (lost or removed); `minions reconcile {}` republishes them",
                    job.job
                ),
            ));
        }
        Some(q) => {
            let ahead = queue.depth.saturating_sub(q);
            if ahead > 0 && out.iter().any(|x| x.key == "no_free_slot") {
                out.push(r(
                    "queued_behind",
                    format!(
                        "{ahead} shards of other jobs are in the queue too; the queue runs in order of submission"
                    ),
                ));
            }
        }
        None if !queue.ok => out.push(r(
            "queue_unreadable",
            format!(
                "the work queue cannot be read: {}",
                queue.error.clone().unwrap_or_default()
            ),
        )),
        None => {}
    }
    if let Some((shard, reason)) = &facts.last_retry {
        out.push(r(
            "retrying",
            format!("shards that failed wait out a retry delay; the last, shard {shard}: {reason}"),
        ));
    }
    if out.is_empty() {
        out.push(r(
            "starting",
            format!(
                "nothing blocks: {} available workers have free slots, so waiting shards start within a second",
                fits.len()
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use minions_schemas::messages::WorkerState;
    use minions_schemas::progress::JobState;

    fn job(pending: u32, running: u32) -> Progress {
        Progress {
            job: "j1".into(),
            state: JobState::Running,
            model: "m".into(),
            records: 100,
            shards: 10,
            done: 10 - pending - running,
            running,
            pending,
            failed: 0,
            records_done: 0,
            redeliveries: 0,
            handed_back: 0,
            rejected: 0,
            verified: 0,
            verifying: 0,
            disagreements: 0,
            unverified: 0,
            checks_wait: None,
            rate: 0.0,
            eta_secs: None,
            created_ms: 0,
            tokens: 0,
            token_rate: 0.0,
            audio_secs: 0.0,
            audio_rate: 0.0,
            failed_shards: Vec::new(),
            team: "default".into(),
            priority: Default::default(),
            preemptible: false,
        }
    }

    fn worker(host: &str, state: WorkerState, owner: &str, running: usize) -> WorkerRow {
        WorkerRow {
            id: format!("{host}-1"),
            host: host.into(),
            device: "cpu".into(),
            build: String::new(),
            kernel: String::new(),
            state,
            owner: owner.into(),
            slots: 2,
            holds: 2,
            running: (0..running).map(|i| format!("j0/{i}")).collect(),
            done: 0,
            failed: 0,
            rate: 0.0,
            mem_total_mb: 16_000,
            mem_avail_mb: 8_000,
            mem_budget_mb: 4_000,
            stage: String::new(),
            last_beat_secs: 0.1,
        }
    }

    fn queue() -> QueueInfo {
        QueueInfo {
            ok: true,
            depth: 5,
            max_ack_pending: 100,
            ..Default::default()
        }
    }

    fn keys(v: &[Reason]) -> Vec<&'static str> {
        v.iter().map(|r| r.key).collect()
    }

    fn facts(queued: u64) -> JobFacts {
        JobFacts {
            model_mb: Some(90),
            last_retry: None,
            queued: Some(queued),
            sharing: None,
        }
    }

    #[test]
    fn no_workers() {
        let v = explain(&job(5, 0), &facts(5), &[], &queue());
        assert_eq!(keys(&v), ["no_workers"]);
    }

    #[test]
    fn every_owner_is_back() {
        let w = [
            worker("a", WorkerState::Draining, "yielded: input 2 s ago", 0),
            worker("b", WorkerState::Draining, "yielded: on battery", 0),
        ];
        let v = explain(&job(5, 0), &facts(5), &w, &queue());
        assert_eq!(keys(&v), ["all_owners_active"]);
        assert!(
            v[0].text.contains("b: yielded: on battery"),
            "{}",
            v[0].text
        );
    }

    #[test]
    fn model_too_large_for_every_idle_machine() {
        let w = [worker("a", WorkerState::Idle, "available", 0)];
        let mut f = facts(5);
        f.model_mb = Some(9_000);
        let v = explain(&job(5, 0), &f, &w, &queue());
        assert_eq!(keys(&v), ["model_too_large"]);
        assert!(v[0].text.contains("4000 MB on a"), "{}", v[0].text);
    }

    #[test]
    fn busy_slots_and_a_full_ack_limit() {
        let w = [worker("a", WorkerState::Busy, "available", 2)];
        let mut q = queue();
        q.depth = 12;
        q.ack_pending = 100;
        let v = explain(&job(5, 0), &facts(5), &w, &q);
        assert_eq!(
            keys(&v),
            ["no_free_slot", "max_ack_pending", "queued_behind"]
        );
    }

    #[test]
    fn lost_shards_and_retries() {
        let w = [worker("a", WorkerState::Idle, "available", 0)];
        let mut f = facts(2);
        f.last_retry = Some((3, "store unreachable".into()));
        let v = explain(&job(5, 0), &f, &w, &queue());
        assert_eq!(keys(&v), ["not_queued", "retrying"]);
        assert!(v[0].text.contains("minions reconcile j1"));
    }

    #[test]
    fn nothing_blocks_or_nothing_waits() {
        let w = [worker("a", WorkerState::Idle, "available", 0)];
        assert_eq!(
            keys(&explain(&job(5, 0), &facts(5), &w, &queue())),
            ["starting"]
        );
        assert_eq!(
            keys(&explain(&job(0, 3), &facts(3), &w, &queue())),
            ["all_running"]
        );
        let mut done = job(0, 0);
        done.state = JobState::Done;
        assert_eq!(keys(&explain(&done, &facts(0), &w, &queue())), ["ended"]);
    }
}
