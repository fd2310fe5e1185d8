//! Many teams, one fleet: a real nats-server, a watchdog and four real
//! one-slot workers (two lend 100 MB, two 4,000 MB) run jobs of several
//! teams, and the events say who got the slots:
//! - fair share between two teams (each within 10% of half, per 10 s
//!   window), the newcomer's first shard within 2 s of a slot freeing, and
//!   the fleet back to the first team when the second is done;
//! - weights 3:1 give 75% / 25% within 10%;
//! - a high-priority job behind 2,000 queued shards of its own team starts
//!   within 1 s of a slot freeing;
//! - a job needing 1,000 MB runs only on the two workers that lend it, and
//!   one needing 100,000 MB says on its job page that no worker lends it;
//! - a team with a quota of one slot holds one (over it less than a tenth
//!   of the time: a quota is kept on average, see WIRE.md §3.4.1);
//! - a preemptible job yields its slots within 1 s to other work, and every
//!   output of both jobs is there exactly once.
//!
//! The figures are printed; the whole runs in about 90 s. The workers are
//! paced (`Fleet::push_slow_model`): shards last as long as they would
//! computing, with the cores at rest.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use minions_schemas::messages::{EventKind, ShardEvent};
use minions_schemas::time::now_ms;
use minions_tests::{Fleet, Result, minions_submit, write_corpus};

/// Texts per shard of the short-shard jobs.
const SHORT: u32 = 4;

struct Setup {
    fleet: Fleet,
    model: PathBuf,
}

impl Setup {
    fn dir(&self) -> &Path {
        self.fleet.dir.path()
    }

    /// Submits `shards` shards of `per_shard` texts as `job` with `flags`;
    /// returns the texts and when submit returned (ms since the epoch).
    fn submit(
        &self,
        job: &str,
        shards: usize,
        per_shard: u32,
        flags: &[&str],
    ) -> Result<(Vec<String>, u64)> {
        let input = self.dir().join(format!("{job}.jsonl"));
        let texts = write_corpus(&input, shards * per_shard as usize)?;
        let mut extra = vec!["--job", job];
        extra.extend_from_slice(flags);
        let id = minions_submit(&self.fleet.cli_env(), "slow", &input, per_shard, &extra)?;
        assert_eq!(id, job);
        Ok((texts, now_ms()))
    }

    fn cancel(&self, job: &str) -> Result<()> {
        self.fleet.cli(&["cancel", job])?;
        Ok(())
    }
}

/// A finished shard: which team's, when it ended and how long it ran.
#[derive(Debug, Clone)]
struct Ran {
    team: String,
    end_ms: u64,
    duration_ms: u64,
}

async fn events(fleet: &Fleet, job: &str) -> Result<Vec<ShardEvent>> {
    fleet.events(job).await
}

fn done_of(events: &[ShardEvent], team: &str) -> Vec<Ran> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Done { duration_ms, .. } => Some(Ran {
                team: team.to_owned(),
                end_ms: e.at_ms,
                duration_ms: *duration_ms,
            }),
            _ => None,
        })
        .collect()
}

fn starts(events: &[ShardEvent]) -> Vec<(u64, String)> {
    let mut v: Vec<(u64, String)> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Started))
        .map(|e| (e.at_ms, e.worker.to_string()))
        .collect();
    v.sort();
    v
}

/// Each team's share of the shard time completed in each whole 10 s window
/// of `[from, to)`; prints them.
fn shares(label: &str, ran: &[Ran], from: u64, to: u64) -> Vec<BTreeMap<String, f64>> {
    let mut out = Vec::new();
    let mut start = from;
    while start + 10_000 <= to {
        let mut by: BTreeMap<String, f64> = BTreeMap::new();
        for r in ran
            .iter()
            .filter(|r| r.end_ms >= start && r.end_ms < start + 10_000)
        {
            *by.entry(r.team.clone()).or_default() += r.duration_ms as f64;
        }
        let total: f64 = by.values().sum();
        if total > 0.0 {
            for v in by.values_mut() {
                *v /= total;
            }
        }
        let shown: Vec<String> = by
            .iter()
            .map(|(t, s)| format!("team {t} {:.1}%", s * 100.0))
            .collect();
        eprintln!(
            "{label}: window {:>3}-{:>3} s: {}",
            (start - from) / 1000,
            (start - from) / 1000 + 10,
            shown.join(", ")
        );
        out.push(by);
        start += 10_000;
    }
    out
}

/// The first shard end of `ran` at or after `t` (a slot freeing).
fn first_free_after(ran: &[Ran], t: u64) -> Option<u64> {
    ran.iter().map(|r| r.end_ms).filter(|&e| e >= t).min()
}

async fn wait_done(fleet: &Fleet, job: &str, within: Duration) -> Result<()> {
    let until = Instant::now() + within;
    loop {
        let s = fleet.cli(&["status", job, "--json"])?;
        let v: serde_json::Value = serde_json::from_str(&s)?;
        if v["state"] == "done" {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!("{job} not done within {within:?}: {s}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `job` has `n` shards started.
async fn wait_started(fleet: &Fleet, job: &str, n: usize, within: Duration) -> Result<()> {
    let until = Instant::now() + within;
    while starts(&events(fleet, job).await?).len() < n {
        if Instant::now() > until {
            return Err(format!("{job}: fewer than {n} shards started within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn teams_share_the_fleet() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let model = fleet.push_slow_model()?;
    fleet.add_watchdog(&[])?;
    for lend in ["100", "100", "4000", "4000"] {
        fleet.add_worker(&["--slots", "1", "--lend-memory-mb", lend])?;
    }
    let setup = Setup { fleet, model };
    let r = scenarios(&setup).await;
    setup.fleet.explain(r)
}

async fn scenarios(s: &Setup) -> Result<()> {
    fair_share(s).await?;
    weights(s).await?;
    priority(s).await?;
    memory(s).await?;
    quota(s).await?;
    preemption(s).await?;
    Ok(())
}

/// Team a alone, then team b too, then a alone again.
async fn fair_share(s: &Setup) -> Result<()> {
    s.submit("fa", 2_000, SHORT, &["--team", "a"])?;
    wait_started(&s.fleet, "fa", 4, Duration::from_secs(60)).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Enough shards for b to run past one whole 10 s window at its half
    // share (about 12 s at ~80 ms a shard on 2 of the 4 workers).
    let (_, b_submitted) = s.submit("fb", 300, SHORT, &["--team", "b"])?;
    wait_done(&s.fleet, "fb", Duration::from_secs(240)).await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    s.cancel("fa")?;

    let a = events(&s.fleet, "fa").await?;
    let b = events(&s.fleet, "fb").await?;
    let ran_a = done_of(&a, "a");
    let ran_b = done_of(&b, "b");
    let mean = ran_a.iter().map(|r| r.duration_ms).sum::<u64>() / ran_a.len().max(1) as u64;
    eprintln!("fair share: a shard takes {mean} ms on average");

    let b_first = starts(&b).first().map(|s| s.0).ok_or("b never started")?;
    let freed = first_free_after(&ran_a, b_submitted).unwrap_or(b_first);
    let wait = b_first as i64 - freed as i64;
    eprintln!("fair share: team b's first shard started {wait} ms after a slot freed");
    assert!(wait <= 2_000, "team b waited {wait} ms after a slot freed");

    let b_last = ran_b
        .iter()
        .map(|r| r.end_ms)
        .max()
        .ok_or("b never finished")?;
    let mut both = ran_a.clone();
    both.extend(ran_b.iter().cloned());
    // Windows start once b holds its share (its first shard done).
    let from = ran_b.iter().map(|r| r.end_ms).min().unwrap_or(b_first);
    let windows = shares("fair share", &both, from, b_last);
    eprintln!(
        "fair share: team b ran {} shards in {:.1} s after its first was done",
        ran_b.len(),
        b_last.saturating_sub(from) as f64 / 1000.0
    );
    assert!(
        !windows.is_empty(),
        "team b ran for less than a whole window"
    );
    for w in &windows {
        for team in ["a", "b"] {
            let share = w.get(team).copied().unwrap_or(0.0);
            assert!(
                (share - 0.5).abs() <= 0.05,
                "team {team} had {:.1}% of a window, not 50% within 10%",
                share * 100.0
            );
        }
    }
    // When b is done, a gets every worker back.
    let after: HashSet<String> = starts(&a)
        .into_iter()
        .filter(|(t, _)| *t > b_last)
        .map(|(_, w)| w)
        .collect();
    eprintln!(
        "fair share: after team b finished, team a ran on {} workers",
        after.len()
    );
    assert_eq!(after.len(), 4, "team a did not get every worker back");
    Ok(())
}

/// Team a with weight 3 and team b with weight 1.
async fn weights(s: &Setup) -> Result<()> {
    s.fleet.cli(&["team", "set", "a", "--weight", "3"])?;
    let listed = s.fleet.cli(&["team", "list"])?;
    assert!(listed.contains("team a: weight 3"), "{listed}");
    s.submit("wa", 2_000, SHORT, &["--team", "a"])?;
    s.submit("wb", 2_000, SHORT, &["--team", "b"])?;
    wait_started(&s.fleet, "wb", 1, Duration::from_secs(30)).await?;
    tokio::time::sleep(Duration::from_secs(28)).await;
    s.cancel("wa")?;
    s.cancel("wb")?;
    s.fleet.cli(&["team", "set", "a", "--weight", "1"])?;
    let mut both = done_of(&events(&s.fleet, "wa").await?, "a");
    let b = done_of(&events(&s.fleet, "wb").await?, "b");
    let from = b
        .iter()
        .map(|r| r.end_ms)
        .min()
        .ok_or("wb never finished a shard")?
        // Windows start once the teams have settled (team a held every
        // slot until b's first shard ended).
        + 3_000;
    let to = b.iter().map(|r| r.end_ms).max().unwrap_or(from);
    both.extend(b);
    let windows = shares("weights 3:1", &both, from, to);
    assert!(!windows.is_empty(), "no whole window");
    for w in &windows {
        let a = w.get("a").copied().unwrap_or(0.0);
        assert!(
            (a - 0.75).abs() <= 0.075,
            "team a (weight 3) had {:.1}%, not 75% within 10%",
            a * 100.0
        );
    }
    Ok(())
}

/// A high-priority job behind 2,000 queued shards of the same team.
async fn priority(s: &Setup) -> Result<()> {
    s.submit("pn", 2_000, SHORT, &["--team", "a"])?;
    wait_started(&s.fleet, "pn", 4, Duration::from_secs(60)).await?;
    let (_, submitted) = s.submit("ph", 20, SHORT, &["--team", "a", "--priority", "high"])?;
    wait_done(&s.fleet, "ph", Duration::from_secs(120)).await?;
    s.cancel("pn")?;
    let normal = done_of(&events(&s.fleet, "pn").await?, "a");
    let high = events(&s.fleet, "ph").await?;
    let first = starts(&high)
        .first()
        .map(|s| s.0)
        .ok_or("ph never started")?;
    let freed = first_free_after(&normal, submitted).unwrap_or(first);
    let wait = first as i64 - freed as i64;
    eprintln!(
        "priority: the high job's first shard started {wait} ms after a slot freed ({} normal shards queued)",
        2_000 - normal.len()
    );
    assert!(
        wait <= 1_000,
        "the high job waited {wait} ms after a slot freed"
    );
    Ok(())
}

/// A job that needs more memory than two of the four workers lend.
async fn memory(s: &Setup) -> Result<()> {
    let workers = s.fleet.cli(&["worker", "list", "--json"])?;
    let list: serde_json::Value = serde_json::from_str(&workers)?;
    s.submit("big", 200, SHORT, &["--memory-mb", "1000"])?;
    wait_done(&s.fleet, "big", Duration::from_secs(180)).await?;
    let ev = events(&s.fleet, "big").await?;
    let mut by: HashMap<String, usize> = HashMap::new();
    for (_, w) in starts(&ev) {
        *by.entry(w).or_default() += 1;
    }
    eprintln!("memory: deliveries by worker {by:?}");
    // Workers 1 and 2 lend 100 MB.
    for (w, n) in &by {
        assert!(
            !(w.starts_with("w1-") || w.starts_with("w2-")),
            "{n} deliveries went to {w}, which lends 100 MB (workers: {list})"
        );
    }
    assert_eq!(by.len(), 2, "the big job should run on both large workers");
    s.fleet
        .check_outputs("big", &s.model, &texts_of(s, "big")?)?;

    // A job no worker can take says why it waits.
    s.submit("huge", 4, SHORT, &["--memory-mb", "100000"])?;
    let base = s.fleet.dashboards[0].clone();
    let until = Instant::now() + Duration::from_secs(30);
    let why = loop {
        let (code, body) = minions_tests::web::get(&format!("{base}/api/jobs/huge"))?;
        if code == 200 && body.contains("no live worker lends 100000 MB") {
            break body;
        }
        if Instant::now() > until {
            return Err(format!("the job page never said why huge waits: {body}").into());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let v: serde_json::Value = serde_json::from_str(&why)?;
    eprintln!("memory: why huge waits: {}", v["waiting_because"]);
    s.cancel("huge")?;
    Ok(())
}

/// A team capped at one slot.
async fn quota(s: &Setup) -> Result<()> {
    s.fleet.cli(&["team", "set", "capped", "--quota", "1"])?;
    s.submit("cap", 60, SHORT, &["--team", "capped"])?;
    wait_done(&s.fleet, "cap", Duration::from_secs(120)).await?;
    // Most shards of the team running at once, from start and end events.
    let ev = events(&s.fleet, "cap").await?;
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for e in &ev {
        match e.kind {
            EventKind::Started => edges.push((e.at_ms, 1)),
            EventKind::Done { .. } | EventKind::HandedBack { .. } | EventKind::Failed { .. } => {
                edges.push((e.at_ms, -1))
            }
            _ => {}
        }
    }
    edges.sort();
    let (mut now, mut most, mut over_ms, mut since) = (0i32, 0i32, 0u64, 0u64);
    for (t, d) in edges {
        if now > 1 {
            over_ms += t - since;
        }
        now += d;
        most = most.max(now);
        since = t;
    }
    let first = ev.iter().map(|e| e.at_ms).min().unwrap_or(0);
    let last = ev.iter().map(|e| e.at_ms).max().unwrap_or(0);
    eprintln!(
        "quota: team capped (quota 1) ran at most {most} at once, over its quota {over_ms} ms of {} ms",
        last - first
    );
    assert!(
        over_ms * 10 <= last - first,
        "team capped was over its quota more than a tenth of the time"
    );
    Ok(())
}

/// A preemptible job with long shards, then a normal job of another team.
async fn preemption(s: &Setup) -> Result<()> {
    let (p_texts, _) = s.submit("scav", 16, 96, &["--team", "a", "--preemptible"])?;
    wait_started(&s.fleet, "scav", 4, Duration::from_secs(60)).await?;
    let (r_texts, submitted) = s.submit("urgent", 24, SHORT, &["--team", "b"])?;
    wait_done(&s.fleet, "urgent", Duration::from_secs(120)).await?;
    let r = events(&s.fleet, "urgent").await?;
    let r_starts = starts(&r);
    // The fourth distinct worker on the urgent job: all slots yielded.
    let mut seen = HashSet::new();
    let mut all_by = None;
    for (t, w) in &r_starts {
        seen.insert(w.clone());
        if seen.len() == 4 {
            all_by = Some(*t);
            break;
        }
    }
    let first = r_starts
        .first()
        .map(|s| s.0)
        .ok_or("urgent never started")?;
    eprintln!(
        "preemption: urgent's first shard {} ms after submit, all four workers on it after {} ms",
        first as i64 - submitted as i64,
        all_by.map_or(-1, |t| t as i64 - submitted as i64)
    );
    assert!(
        first <= submitted + 1_000,
        "the preemptible job did not yield a slot within 1 s"
    );
    wait_done(&s.fleet, "scav", Duration::from_secs(300)).await?;
    let p = events(&s.fleet, "scav").await?;
    let yielded = p
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::HandedBack { reason } if reason.starts_with("preempted")))
        .count();
    eprintln!("preemption: {yielded} preemptible deliveries handed back");
    assert!(yielded >= 1, "no preemptible shard was handed back");
    s.fleet.check_outputs("scav", &s.model, &p_texts)?;
    s.fleet.check_outputs("urgent", &s.model, &r_texts)?;
    Ok(())
}

fn texts_of(s: &Setup, job: &str) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(s.dir().join(format!("{job}.jsonl")))?;
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)?;
            Ok(v["text"].as_str().ok_or("no text")?.to_owned())
        })
        .collect()
}
