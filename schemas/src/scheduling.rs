//! Sharing the fleet between teams: one pull consumer per job, a schedule of
//! what is queued, and the rule by which a worker's free slot chooses the job
//! it pulls from next.
//!
//! JetStream has no per-message priority and a work-queue stream allows no
//! overlapping consumers, so every job gets its own durable consumer
//! ([`job_consumer`], filter [`crate::subjects::job_shards`]) whose metadata
//! carries the job's team, priority, preemptibility and needs. A job whose
//! results are checked gets a second one for its check runs
//! ([`check_consumer`], filter [`crate::subjects::job_checks`]); the
//! schedule counts both under the job and says how many checks wait
//! ([`QueuedJob::checks`]), and a worker pulls those first, so that checks
//! run beside the job's shards rather than after the last of them. A worker
//! slot never waits on a consumer: it [`pick`]s a job from the latest
//! [`Schedule`] and fetches one message from that job's consumer without
//! waiting; when the fetch comes back empty it picks again without that job.
//!
//! The rule (the same in every worker, and in the watchdog when it explains
//! why a job waits):
//! 1. Only jobs the worker can run ([`Requirements::met_by`]) whose team is
//!    under its quota.
//! 2. Non-preemptible jobs first; preemptible jobs only when no other job is
//!    waiting for this worker.
//! 3. Across teams, fair share: the team with the fewest running shards per
//!    unit of [`TeamShare::claim`] (weight discounted by recent usage).
//! 4. Within the team, higher priority first, then a job whose model the
//!    worker already holds, then the oldest.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::ids::{JobId, ModelHash};
use crate::messages::{
    JobSpec, Priority, QueuedJob, Requirements, Schedule, TeamPolicy, TeamShare,
};

/// The work-stream consumer of one job.
pub fn job_consumer(job: &JobId) -> String {
    format!("job-{job}")
}

/// The work-stream consumer of one job's check runs.
pub fn check_consumer(job: &JobId) -> String {
    format!("checks-{job}")
}

/// The job a consumer name belongs to, if it is a job's consumer (of its
/// shards or of its check runs).
pub fn consumer_job(name: &str) -> Option<JobId> {
    let id = name
        .strip_prefix("job-")
        .or_else(|| name.strip_prefix("checks-"))?;
    JobId::new(id).ok()
}

/// Job-consumer metadata keys (all values strings; WIRE.md §3.4).
pub const META_JOB: &str = "minions.job";
/// See [`META_JOB`].
pub const META_TEAM: &str = "minions.team";
/// See [`META_JOB`].
pub const META_PRIORITY: &str = "minions.priority";
/// See [`META_JOB`].
pub const META_PREEMPTIBLE: &str = "minions.preemptible";
/// See [`META_JOB`].
pub const META_MEMORY: &str = "minions.memory_mb";
/// See [`META_JOB`].
pub const META_DEVICES: &str = "minions.devices";
/// See [`META_JOB`].
pub const META_MODEL: &str = "minions.model";
/// See [`META_JOB`] (absent: 0).
pub const META_STAGES: &str = "minions.stages";
/// See [`META_JOB`].
pub const META_CREATED: &str = "minions.created_ms";
/// Marks a job's check consumer (value `true`).
pub const META_CHECKS: &str = "minions.checks";

/// A job consumer as the contract defines it, apart from the work stream's
/// settings: name, description, filter and the job's scheduling facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobConsumer {
    /// The durable name ([`job_consumer`] or [`check_consumer`]).
    pub name: String,
    /// The description the server shows.
    pub description: String,
    /// The one subject filter: the job's shards or its check runs.
    pub filter: String,
    /// What the schedule reads back ([`queued_job`]).
    pub metadata: HashMap<String, String>,
}

impl JobConsumer {
    /// `spec`'s consumer: the job's subjects only, and the job's scheduling
    /// facts as metadata.
    pub fn of_job(spec: &JobSpec) -> Self {
        let mut metadata = HashMap::new();
        metadata.insert(META_JOB.to_owned(), spec.job.to_string());
        metadata.insert(META_TEAM.to_owned(), spec.team.clone());
        metadata.insert(META_PRIORITY.to_owned(), spec.priority.as_str().to_owned());
        metadata.insert(META_PREEMPTIBLE.to_owned(), spec.preemptible.to_string());
        metadata.insert(META_MEMORY.to_owned(), spec.needs.memory_mb.to_string());
        metadata.insert(META_DEVICES.to_owned(), spec.needs.devices.join(","));
        if spec.needs.stages > 1 {
            metadata.insert(META_STAGES.to_owned(), spec.needs.stages.to_string());
        }
        metadata.insert(META_MODEL.to_owned(), spec.model_hash.to_string());
        metadata.insert(META_CREATED.to_owned(), spec.created_ms.to_string());
        Self {
            name: job_consumer(&spec.job),
            description: format!("Minions job {} (team {})", spec.job, spec.team),
            filter: crate::subjects::job_shards(&spec.job),
            metadata,
        }
    }

    /// `spec`'s check consumer: as its job consumer, on the job's check
    /// subjects, marked as the checks'.
    pub fn of_checks(spec: &JobSpec) -> Self {
        let mut c = Self::of_job(spec);
        c.name = check_consumer(&spec.job);
        c.description = format!("Minions job {} (team {}): check runs", spec.job, spec.team);
        c.filter = crate::subjects::job_checks(&spec.job);
        c.metadata.insert(META_CHECKS.to_owned(), "true".to_owned());
        c
    }
}

/// Reads a job consumer's metadata and counts (messages waiting, delivered
/// and unacknowledged) into a schedule entry (`None` for consumers that are
/// not a job's, or whose metadata is damaged).
pub fn queued_job(
    metadata: &HashMap<String, String>,
    num_pending: u64,
    num_ack_pending: u64,
) -> Option<QueuedJob> {
    let meta = metadata;
    let job = JobId::new(meta.get(META_JOB)?.as_str()).ok()?;
    let devices = meta
        .get(META_DEVICES)
        .map(|d| {
            d.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let checks = meta.get(META_CHECKS).is_some_and(|c| c == "true");
    Some(QueuedJob {
        job,
        team: meta.get(META_TEAM)?.clone(),
        priority: Priority::parse(meta.get(META_PRIORITY)?)?,
        preemptible: meta.get(META_PREEMPTIBLE).is_some_and(|p| p == "true"),
        needs: Requirements {
            memory_mb: meta.get(META_MEMORY)?.parse().ok()?,
            devices,
            stages: match meta.get(META_STAGES) {
                Some(s) => s.parse().ok()?,
                None => 0,
            },
        },
        model_hash: ModelHash::new(meta.get(META_MODEL)?.as_str()).ok()?,
        created_ms: meta.get(META_CREATED)?.parse().ok()?,
        pending: num_pending,
        running: num_ack_pending,
        // Out and unacknowledged counts too: a check run handed back by a
        // machine it avoids waits as a redelivery, not as pending.
        checks: if checks {
            num_pending + num_ack_pending
        } else {
            0
        },
    })
}

/// Adds `entry` to `jobs`: a job's check consumer's counts go into its
/// job's entry (made from either consumer, whichever came first).
pub fn add_queued(jobs: &mut Vec<QueuedJob>, entry: QueuedJob) {
    match jobs.iter_mut().find(|j| j.job == entry.job) {
        Some(into) => {
            into.pending += entry.pending;
            into.running += entry.running;
            into.checks += entry.checks;
        }
        None => jobs.push(entry),
    }
}

/// The fleet's team policies, as stored under [`TEAMS_KEY`] in
/// [`crate::streams::TEAMS_BUCKET`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Teams {
    /// Schema version.
    pub v: u16,
    /// Policy by team name.
    pub teams: BTreeMap<String, TeamPolicy>,
}

/// The key of the team policies in [`TEAMS_BUCKET`].
pub const TEAMS_KEY: &str = "policy";

/// Builds a schedule from `jobs` (jobs with nothing queued or running are
/// left out), the team policies and each team's recent usage (slots).
pub fn build(
    at_ms: u64,
    jobs: Vec<QueuedJob>,
    teams: &Teams,
    usage: &HashMap<String, f64>,
) -> Schedule {
    let jobs: Vec<QueuedJob> = jobs
        .into_iter()
        .filter(|j| j.pending > 0 || j.running > 0)
        .collect();
    let mut names: HashSet<&str> = teams.teams.keys().map(String::as_str).collect();
    names.extend(jobs.iter().map(|j| j.team.as_str()));
    let mut shares: Vec<TeamShare> = names
        .into_iter()
        .map(|t| {
            let p = teams.teams.get(t).cloned().unwrap_or_default();
            TeamShare {
                team: t.to_owned(),
                weight: p.weight,
                quota: p.quota,
                usage: usage.get(t).copied().unwrap_or(0.0),
            }
        })
        .collect();
    shares.sort_by(|a, b| a.team.cmp(&b.team));
    Schedule {
        v: crate::SCHEMA_VERSION,
        at_ms,
        jobs,
        teams: shares,
        preempt: 0.0,
        idle: 0,
    }
}

/// What a worker lends, for [`pick`].
#[derive(Debug, Clone, Default)]
pub struct Lender {
    /// Memory it lends to models, MB (0 = unknown: any job fits).
    pub memory_mb: u64,
    /// Its device, e.g. `cpu`, `cuda:0`, `metal`.
    pub device: String,
    /// Models it holds (loaded or on disk).
    pub cached: HashSet<ModelHash>,
    /// The job whose group it leads (its first stage): it pulls that job
    /// only.
    pub leads: Option<JobId>,
}

/// What a worker has done since the schedule it picks from was read.
#[derive(Debug, Clone, Default)]
pub struct Since {
    /// Shards it started per job, minus those it finished.
    pub started: HashMap<JobId, i64>,
    /// Jobs whose consumer had nothing to deliver when asked.
    pub empty: HashSet<JobId>,
}

/// One slot's turn: what keeps a fleet of workers, each picking from the
/// same slightly stale schedule, from all moving to the team that is short
/// at once (and overshooting it).
#[derive(Debug, Clone, Default)]
pub struct Turn {
    /// The team of the shard this slot ran last, if any.
    pub previous_team: Option<String>,
    /// Slots expected to free fleet-wide before the next schedule (running
    /// shards × schedule period / mean shard time); below 1 counts as 1.
    pub spread: f64,
    /// A uniform random number in [0, 1).
    pub dice: f64,
    /// Another, for quotas: a team with `h` slots of headroom under its
    /// quota is eligible with probability `h / spread`, so that the slots
    /// freeing before the next schedule do not all take it past its cap.
    pub quota_dice: f64,
}

impl Turn {
    /// A turn that always moves to the fair-share choice.
    pub fn eager() -> Self {
        Self::default()
    }
}

/// Which jobs [`pick`] may choose from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tiers {
    /// Any job.
    All,
    /// Non-preemptible jobs only (to ask whether preemptible work should
    /// yield).
    RegularOnly,
}

/// The job a free slot of `lender` should pull from next, by the rule in
/// the module's documentation; `None` when nothing it can run is queued.
///
/// Moving a slot from its previous team to a short team happens with
/// probability `short slots / turn.spread`, so that across the slots that
/// free before the next schedule about as many move as the short team
/// lacks; otherwise the slot stays with its previous team.
pub fn pick(
    schedule: &Schedule,
    lender: &Lender,
    since: &Since,
    tiers: Tiers,
    turn: &Turn,
) -> Option<JobId> {
    let adj = |j: &QueuedJob| since.started.get(&j.job).copied().unwrap_or(0);
    let mut running_all: HashMap<&str, f64> = HashMap::new();
    let mut running_regular: HashMap<&str, f64> = HashMap::new();
    for j in &schedule.jobs {
        let r = (j.running as i64 + adj(j)).max(0) as f64;
        *running_all.entry(&j.team).or_default() += r;
        if !j.preemptible {
            *running_regular.entry(&j.team).or_default() += r;
        }
    }
    let share = |team: &str| {
        schedule
            .teams
            .iter()
            .find(|t| t.team == team)
            .cloned()
            .unwrap_or_else(|| TeamShare {
                team: team.to_owned(),
                weight: 1.0,
                quota: 0,
                usage: 0.0,
            })
    };
    let able: Vec<&QueuedJob> = schedule
        .jobs
        .iter()
        .filter(|j| !since.empty.contains(&j.job))
        .filter(|j| match &lender.leads {
            Some(led) => &j.job == led,
            None => j.needs.met_by(lender.memory_mb, &lender.device),
        })
        .filter(|j| {
            let q = share(&j.team).quota;
            let headroom = f64::from(q) - running_all.get(j.team.as_str()).copied().unwrap_or(0.0);
            q == 0 || (headroom > 0.0 && turn.quota_dice * turn.spread.max(1.0) < headroom)
        })
        .collect();
    // Jobs with undelivered shards first; then jobs whose shards are all
    // out, one of which may be waiting to be redelivered.
    let queued = |j: &QueuedJob| j.pending as i64 - adj(j).max(0) > 0;
    let tail = |j: &QueuedJob| !queued(j) && j.running > 0;
    let mut tiers_in_order: Vec<Vec<&QueuedJob>> = Vec::new();
    for preemptible in [false, true] {
        if preemptible && tiers == Tiers::RegularOnly {
            break;
        }
        let of_tier = |want: &dyn Fn(&QueuedJob) -> bool| -> Vec<&QueuedJob> {
            able.iter()
                .copied()
                .filter(|j| j.preemptible == preemptible && want(j))
                .collect()
        };
        tiers_in_order.push(of_tier(&queued));
        tiers_in_order.push(of_tier(&tail));
    }
    for (i, candidates) in tiers_in_order.iter().enumerate() {
        if candidates.is_empty() {
            continue;
        }
        let running = if i < 2 {
            &running_regular
        } else {
            &running_all
        };
        return best(candidates, running, &share, lender, turn).map(|j| j.job.clone());
    }
    None
}

/// The fair-share team among `candidates`, then its best job.
fn best<'a>(
    candidates: &[&'a QueuedJob],
    running: &HashMap<&str, f64>,
    share: &dyn Fn(&str) -> TeamShare,
    lender: &Lender,
    turn: &Turn,
) -> Option<&'a QueuedJob> {
    // Within a team: priority, then a model this worker holds, then age.
    let job_key = |j: &QueuedJob| {
        (
            std::cmp::Reverse(j.priority),
            !lender.cached.contains(&j.model_hash),
            j.created_ms,
            j.job.to_string(),
        )
    };
    let mut by_team: BTreeMap<&str, &'a QueuedJob> = BTreeMap::new();
    for &j in candidates {
        by_team
            .entry(&j.team)
            .and_modify(|b| {
                if job_key(j) < job_key(b) {
                    *b = j;
                }
            })
            .or_insert(j);
    }
    let (_, _, fair_team, fair) = by_team
        .iter()
        .map(|(team, j)| {
            let load = running.get(team).copied().unwrap_or(0.0) / share(team).claim();
            (load, j.created_ms, *team, *j)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(b.2)))?;
    let stay = turn
        .previous_team
        .as_deref()
        .filter(|t| *t != fair_team)
        .and_then(|t| by_team.get(t).copied());
    let Some(stay) = stay else {
        return Some(fair);
    };
    // The short team's shortfall, in slots, against its fair part of the
    // slots these teams hold (this one included).
    let claims: f64 = by_team.keys().map(|t| share(t).claim()).sum();
    let held: f64 = by_team
        .keys()
        .map(|t| running.get(t).copied().unwrap_or(0.0))
        .sum::<f64>()
        + 1.0;
    let target = share(fair_team).claim() / claims * held;
    let short = target - running.get(fair_team).copied().unwrap_or(0.0);
    if turn.dice * turn.spread.max(1.0) < short {
        Some(fair)
    } else {
        Some(stay)
    }
}

/// Folds one schedule period into a team's usage: an average of slots in
/// use with half-life `half_life_s` (HTCondor's "real user priority").
pub fn decay_usage(usage: f64, running: f64, dt_s: f64, half_life_s: f64) -> f64 {
    if half_life_s <= 0.0 {
        return running;
    }
    let keep = 0.5f64.powf(dt_s.max(0.0) / half_life_s);
    usage * keep + running * (1.0 - keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> JobId {
        JobId::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn job(
        id: &str,
        team: &str,
        prio: Priority,
        created: u64,
        pending: u64,
        running: u64,
    ) -> QueuedJob {
        QueuedJob {
            job: self::id(id),
            team: team.to_owned(),
            priority: prio,
            preemptible: false,
            needs: Requirements::default(),
            model_hash: ModelHash::new("a".repeat(64)).unwrap_or_else(|e| panic!("{e}")),
            created_ms: created,
            pending,
            running,
            checks: 0,
        }
    }

    fn sched(jobs: Vec<QueuedJob>, teams: &[(&str, f64, u32)]) -> Schedule {
        let mut t = Teams::default();
        for (name, weight, quota) in teams {
            t.teams.insert(
                (*name).to_owned(),
                TeamPolicy {
                    v: 1,
                    weight: *weight,
                    quota: *quota,
                },
            );
        }
        build(0, jobs, &t, &HashMap::new())
    }

    fn pick_id(s: &Schedule, lender: &Lender, since: &Since) -> Option<String> {
        pick(s, lender, since, Tiers::All, &Turn::eager()).map(|j| j.to_string())
    }

    #[test]
    fn the_team_below_its_share_gets_the_slot() {
        let s = sched(
            vec![
                job("a1", "a", Priority::Normal, 1, 1000, 4),
                job("b1", "b", Priority::Normal, 2, 200, 0),
            ],
            &[],
        );
        assert_eq!(
            pick_id(&s, &Lender::default(), &Since::default()).as_deref(),
            Some("b1")
        );
        // With 3:1 weights, a at 3 running and b at 1 is balanced; a at 2 is short.
        let s = sched(
            vec![
                job("a1", "a", Priority::Normal, 1, 1000, 2),
                job("b1", "b", Priority::Normal, 2, 200, 1),
            ],
            &[("a", 3.0, 0), ("b", 1.0, 0)],
        );
        assert_eq!(
            pick_id(&s, &Lender::default(), &Since::default()).as_deref(),
            Some("a1")
        );
    }

    #[test]
    fn priority_then_age_within_a_team() {
        let s = sched(
            vec![
                job("old", "a", Priority::Normal, 1, 1000, 4),
                job("urgent", "a", Priority::High, 5, 10, 0),
                job("new", "a", Priority::Normal, 3, 10, 0),
            ],
            &[],
        );
        assert_eq!(
            pick_id(&s, &Lender::default(), &Since::default()).as_deref(),
            Some("urgent")
        );
        let mut since = Since::default();
        since.empty.insert(id("urgent"));
        assert_eq!(
            pick_id(&s, &Lender::default(), &since).as_deref(),
            Some("old")
        );
    }

    #[test]
    fn needs_quota_and_preemptible_tier() {
        let mut big = job("big", "a", Priority::Normal, 1, 10, 0);
        big.needs.memory_mb = 16_000;
        let small = Lender {
            memory_mb: 8_000,
            device: "cpu".into(),
            ..Default::default()
        };
        let s = sched(vec![big.clone()], &[]);
        assert_eq!(pick_id(&s, &small, &Since::default()), None);
        // Quota: team a holds 2 of 2.
        let s = sched(
            vec![job("a1", "a", Priority::Normal, 1, 10, 2)],
            &[("a", 1.0, 2)],
        );
        assert_eq!(pick_id(&s, &small, &Since::default()), None);
        // Preemptible work runs only when nothing else waits.
        let mut scavenger = job("p", "a", Priority::High, 0, 100, 0);
        scavenger.preemptible = true;
        let s = sched(
            vec![scavenger.clone(), job("r", "b", Priority::Low, 9, 1, 0)],
            &[],
        );
        assert_eq!(pick_id(&s, &small, &Since::default()).as_deref(), Some("r"));
        let s = sched(vec![scavenger], &[]);
        assert_eq!(pick_id(&s, &small, &Since::default()).as_deref(), Some("p"));
        assert_eq!(
            pick(
                &s,
                &small,
                &Since::default(),
                Tiers::RegularOnly,
                &Turn::eager()
            ),
            None
        );
    }

    #[test]
    fn own_starts_count_until_the_next_schedule() {
        let s = sched(
            vec![
                job("a1", "a", Priority::Normal, 1, 100, 2),
                job("b1", "b", Priority::Normal, 2, 100, 1),
            ],
            &[],
        );
        let mut since = Since::default();
        assert_eq!(
            pick_id(&s, &Lender::default(), &since).as_deref(),
            Some("b1")
        );
        since.started.insert(id("b1"), 2);
        assert_eq!(
            pick_id(&s, &Lender::default(), &since).as_deref(),
            Some("a1")
        );
    }

    #[test]
    fn a_job_whose_shards_are_all_out_is_tried_last() {
        let s = sched(
            vec![
                job("tail", "a", Priority::High, 1, 0, 3),
                job("q", "a", Priority::Low, 2, 5, 0),
            ],
            &[],
        );
        assert_eq!(
            pick_id(&s, &Lender::default(), &Since::default()).as_deref(),
            Some("q")
        );
        let s = sched(vec![job("tail", "a", Priority::High, 1, 0, 3)], &[]);
        assert_eq!(
            pick_id(&s, &Lender::default(), &Since::default()).as_deref(),
            Some("tail")
        );
        let s = sched(vec![job("gone", "a", Priority::High, 1, 0, 0)], &[]);
        assert!(s.jobs.is_empty());
    }

    #[test]
    fn slots_move_to_a_short_team_a_few_at_a_time() {
        // Team b arrives: it is short one slot (weights 3:1, four held by a).
        let s = sched(
            vec![
                job("a1", "a", Priority::Normal, 1, 1000, 4),
                job("b1", "b", Priority::Normal, 2, 200, 0),
            ],
            &[("a", 3.0, 0)],
        );
        let moved = (0..1000)
            .filter(|i| {
                let turn = Turn {
                    previous_team: Some("a".into()),
                    spread: 4.0,
                    dice: f64::from(*i) / 1000.0,
                    quota_dice: 0.0,
                };
                pick(&s, &Lender::default(), &Since::default(), Tiers::All, &turn)
                    .is_some_and(|j| j.as_str() == "b1")
            })
            .count();
        // Short 5 × 1/4 = 1.25 slots over 4 freeing: about 31% move.
        assert!((300..=325).contains(&moved), "{moved}");
        // A slot with no previous team, or one from b, takes the fair choice.
        let turn = Turn {
            previous_team: None,
            spread: 4.0,
            dice: 0.99,
            quota_dice: 0.0,
        };
        let j = pick(&s, &Lender::default(), &Since::default(), Tiers::All, &turn);
        assert_eq!(j.map(|j| j.to_string()).as_deref(), Some("b1"));
    }

    #[test]
    fn a_quota_admits_about_as_many_as_its_headroom() {
        // Team a may hold 2 and holds 1; 4 slots free before the next
        // schedule: each takes a with probability 1/4.
        let s = sched(
            vec![job("a1", "a", Priority::Normal, 1, 100, 1)],
            &[("a", 1.0, 2)],
        );
        let took = (0..1000)
            .filter(|i| {
                let turn = Turn {
                    previous_team: None,
                    spread: 4.0,
                    dice: 0.5,
                    quota_dice: f64::from(*i) / 1000.0,
                };
                pick(&s, &Lender::default(), &Since::default(), Tiers::All, &turn).is_some()
            })
            .count();
        assert!((240..=260).contains(&took), "{took}");
    }

    #[test]
    fn usage_decays_with_its_half_life() {
        let u = decay_usage(0.0, 4.0, 3600.0, 3600.0);
        assert!((u - 2.0).abs() < 1e-9, "{u}");
        let u = decay_usage(u, 0.0, 3600.0, 3600.0);
        assert!((u - 1.0).abs() < 1e-9, "{u}");
        let heavy = TeamShare {
            team: "a".into(),
            weight: 1.0,
            quota: 0,
            usage: 3.0,
        };
        assert!((heavy.claim() - 0.25).abs() < 1e-9);
    }

    #[test]
    fn requirements_match_device_kind_and_memory() {
        let r = Requirements {
            memory_mb: 4000,
            devices: vec!["cuda".into(), "metal".into()],
            stages: 0,
        };
        assert!(r.met_by(8000, "cuda:0"));
        assert!(!r.met_by(8000, "cpu"));
        assert!(!r.met_by(2000, "metal"));
        assert!(r.met_by(0, "metal"), "unknown memory is taken as enough");
        let split = Requirements { stages: 2, ..r };
        assert!(
            !split.met_by(8000, "cuda:0"),
            "a group's job is no single worker's"
        );
    }
}
