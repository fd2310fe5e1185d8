//! Benchmark: how long `minions jobs` takes to answer with many jobs in
//! the events stream's history.
//!
//! Fills a real nats-server's events stream with `--jobs` jobs (each: its
//! spec in a local-directory store, its `submitted` event, and a `started`
//! and `done` event per shard, `--shards` shards), writes the manifests of
//! all but the newest `--running` jobs (those are folded from their events,
//! as running jobs are), then times the `minions` binary, spawn to exit,
//! listing the newest 20 (the default), `--limit 100`, and with a `--team`
//! no job has (the worst case: every job's spec is read).
//!
//!   cargo build --workspace --bins
//!   target/debug/bench_jobs --jobs 10000 --rounds 3
//!
//! Prints a Markdown table (for BENCHMARKS.md).

use std::time::Instant;

use minions_schemas::messages::{EventKind, JobManifest, ShardEvent};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, ModelHash, SCHEMA_VERSION, WorkerId};
use minions_tests::bench::{
    EventPublisher, LocalSite, bench_done, help, machine, num, utc_now, write_bench_spec,
};
use minions_tests::{Result, bin, out};

const USAGE: &str = "\
How long `minions jobs` takes with many jobs in the events stream.

Usage: bench_jobs [--jobs N] [--shards S] [--running R] [--rounds K]
  (cargo build --workspace --bins first)

  --jobs N      jobs in the stream's history (10000)
  --shards S    shards per job, each with a started and a done event (20)
  --running R   newest jobs left without a manifest (10)
  --rounds K    timings per listing (3)
";

#[tokio::main]
async fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let jobs = num("--jobs", 10_000)?;
    let shards = u32::try_from(num("--shards", 20)?)?;
    let running = num("--running", 10)?;
    let rounds = num("--rounds", 3)?;
    let minions = bin("minions")?;
    out!("{} · {} · {}", utc_now(), machine(), minions.display());
    let site = LocalSite::start("minions-bench-jobs-").await?;
    let store = minions_endpoints::store::open(&site.store_url)?;
    let mut p = EventPublisher::new(site.js.clone(), 4_096, None);
    let t0 = Instant::now();
    let start = now_ms();
    for n in 0..jobs {
        let job = JobId::new(format!("bench-{n:06}"))?;
        write_bench_spec(&site.store, &job, shards)?;
        let mut submitted = ShardEvent::by_cli(job.clone(), 0, EventKind::Submitted { shards })?;
        submitted.at_ms = start + n;
        p.send(&submitted).await?;
        let worker = WorkerId::new(format!("mac-{:04}-1a2b3c", n % 300))?;
        for shard in 0..shards {
            let ev = |kind| {
                ShardEvent::by_worker(job.clone(), shard, worker.clone(), "mac".into(), 1, kind)
            };
            p.send(&ev(EventKind::Started)).await?;
            p.send(&ev(bench_done(u64::from(shard)))).await?;
        }
        if n + running < jobs {
            let m = JobManifest {
                v: SCHEMA_VERSION,
                job: job.clone(),
                model_hash: ModelHash::new("b".repeat(64))?,
                records: u64::from(shards) * 256,
                done: shards,
                failed: 0,
                rejected: 0,
                verified: 0,
                disagreements: 0,
                unverified: 0,
                shards: Vec::new(),
                completed_ms: start + n + 1_000,
            };
            minions_endpoints::manifest::write(store.as_ref(), &m).await?;
        }
    }
    p.drain().await?;
    out!(
        "{jobs} jobs, {} events, filled in {:.1} s",
        p.sent,
        t0.elapsed().as_secs_f64()
    );
    out!("");
    out!("| listing | jobs shown | runs (s) |");
    out!("|---|---:|---|");
    let env = [
        ("MINIONS_NATS_URL", site.nats.url()),
        ("MINIONS_STORE", site.store_url.clone()),
    ];
    for (name, args) in [
        ("newest 20 (default)", vec!["jobs", "--json"]),
        ("--limit 100", vec!["jobs", "--json", "--limit", "100"]),
        (
            "--team nosuch (reads every spec)",
            vec!["jobs", "--json", "--team", "nosuch"],
        ),
    ] {
        let mut secs = Vec::new();
        let mut shown = 0;
        for _ in 0..rounds {
            let t = Instant::now();
            let o = std::process::Command::new(&minions)
                .args(&args)
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .output()?;
            secs.push(t.elapsed().as_secs_f64());
            if !o.status.success() {
                return Err(String::from_utf8_lossy(&o.stderr).into_owned().into());
            }
            let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
            shown = v.as_array().map_or(0, Vec::len);
        }
        let runs: Vec<String> = secs.iter().map(|s| format!("{s:.2}")).collect();
        out!("| {name} | {shown} | {} |", runs.join(", "));
    }
    Ok(())
}
