//! What sharing the fleet costs: dispatch shards/s with one job queued
//! (everything on one consumer, as one team's queue) against the same
//! shards as 10 teams × 3 priorities (30 jobs, 30 consumers, workers
//! choosing by the schedule), same fleet size, alternating, same run.
//!
//!   source deploy/tools.sh --test
//!   cargo build --release --workspace --bins
//!   target/release/bench_sharing --write
//!
//! Each run: a fresh nats-server and store, a watchdog, the jobs submitted,
//! then 4 workers (2 slots each) started; the figure is the shards over the
//! time from the first `started` event to the last `done` event.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use minions_schemas::messages::{EventKind, ShardEvent};
use minions_schemas::{decode, limits, subjects};
use minions_tests::bench::{
    NOOP, command_line, flag, help, machine, num, utc_now, write_section, write_short,
};
use minions_tests::{Fleet, Result, out};

const USAGE: &str = "\
Dispatch shards/s with one job queued against 10 teams x 3 priorities.

Usage: bench_sharing [--shards N] [--rounds N] [--write]
  (source deploy/tools.sh --test; cargo build --release --workspace --bins first)

  --shards N   shards per run (3000)
  --rounds N   runs of each layout, alternating (3)
  --write      put the Markdown into BENCHMARKS.md between its markers
";

const TEAMS: usize = 10;
const PRIORITIES: [&str; 3] = ["low", "normal", "high"];
const WORKERS: usize = 4;

/// One run: `jobs` jobs of `shards / jobs` shards each; returns shards/s.
async fn run(shards: usize, shared: bool) -> Result<f64> {
    let mut fleet = Fleet::local()?;
    fleet.push_model("noop", NOOP)?;
    fleet.add_watchdog(&[])?;
    let client = fleet.nats.client().await?;
    let mut events = client.subscribe(subjects::EVENT_SUBJECTS).await?;
    client.flush().await?;
    let mut jobs = Vec::new();
    if shared {
        for t in 0..TEAMS {
            for p in PRIORITIES {
                jobs.push((format!("t{t}-{p}"), format!("team{t}"), p));
            }
        }
    } else {
        jobs.push(("one".to_owned(), "default".to_owned(), "normal"));
    }
    let per_job = shards / jobs.len();
    let input = fleet.dir.path().join("short.jsonl");
    write_short(&input, per_job)?;
    let path = input.display().to_string();
    for (job, team, priority) in &jobs {
        fleet.cli(&[
            "submit",
            "--model",
            "noop",
            "--input",
            &path,
            "--shard-size",
            "1",
            "--job",
            job,
            "--team",
            team,
            "--priority",
            priority,
        ])?;
    }
    let total = per_job * jobs.len();
    for _ in 0..WORKERS {
        fleet.add_worker(&["--slots", "2"])?;
    }
    let mut done: HashSet<(String, u32)> = HashSet::new();
    let (mut first_start, mut last_done) = (u64::MAX, 0u64);
    let until = Instant::now() + Duration::from_secs(600);
    while done.len() < total {
        let left = until.saturating_duration_since(Instant::now());
        let m = tokio::time::timeout(left, events.next())
            .await
            .map_err(|_| format!("only {} of {total} shards done in time", done.len()))?
            .ok_or("event subscription ended")?;
        let e: ShardEvent = decode("shard event", &m.payload, limits::MAX_EVENT_BYTES)?;
        match e.kind {
            EventKind::Started => first_start = first_start.min(e.at_ms),
            EventKind::Done { .. } => {
                last_done = last_done.max(e.at_ms);
                done.insert((e.job.to_string(), e.shard));
            }
            _ => {}
        }
    }
    let secs = (last_done.saturating_sub(first_start)) as f64 / 1000.0;
    Ok(total as f64 / secs.max(0.001))
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

#[tokio::main]
async fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let shards = num("--shards", 3000)? as usize;
    let rounds = num("--rounds", 3)? as usize;
    let started = Instant::now();
    let (mut one, mut shared) = (Vec::new(), Vec::new());
    let mut rows = Vec::new();
    for round in 1..=rounds {
        let a = run(shards, false).await?;
        let b = run(shards, true).await?;
        out!("round {round}: one job {a:.0} shards/s, 10 teams x 3 priorities {b:.0} shards/s");
        rows.push(format!("| {round} | {a:.0} | {b:.0} | {:.3} |", b / a));
        one.push(a);
        shared.push(b);
    }
    let ratio = mean(&shared) / mean(&one);
    let doc = format!(
        "## Sharing the fleet: dispatch with 10 teams × 3 priorities against one queue\n\n\
         Made by `source deploy/tools.sh --test && cargo build --release --workspace --bins && \
         target/release/{}` on {} UTC, {}.\n\n\
         {shards} shards of one short text each, the near no-op model of the dispatch runs, \
         a watchdog and {WORKERS} workers with 2 slots each, a fresh nats-server and store per \
         run. *One queue*: one job holds every shard (one consumer, what a single team's \
         queue is). *10 × 3*: the same shards as 30 jobs of 10 teams, each team with a low, \
         a normal and a high job (30 consumers; every free slot picks its job from the \
         watchdog's schedule by fair share and priority, then fetches one shard). The jobs \
         are queued before the workers start; the figure is the shards over the time from \
         the first `started` event to the last `done` event. The two layouts alternate, \
         {rounds} runs each.\n\n\
         | round | one queue (shards/s) | 10 × 3 (shards/s) | ratio |\n|---:|---:|---:|---:|\n{}\n\
         | mean | {:.0} | {:.0} | **{ratio:.3}** |\n\n",
        command_line(),
        utc_now(),
        machine(),
        rows.join("\n"),
        mean(&one),
        mean(&shared),
    );
    out!("\n{doc}");
    if flag("--write") {
        let p = write_section("bench_sharing", &doc)?;
        out!("written to {}", p.display());
    }
    out!("(took {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}
