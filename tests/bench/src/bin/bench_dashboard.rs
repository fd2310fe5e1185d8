//! Benchmark: the watchdog with a large simulated fleet. One process plays N
//! workers (a heartbeat each per second, one shard in flight each, the
//! shard events of a fleet that finishes N/10 shards a second) against a
//! real nats-server and a real `minions-watchdog`; it measures the
//! watchdog's CPU use and how fast its dashboard loads, with a real headless
//! Chromium open on the page throughout, for each fleet size side by side.
//!
//!   cargo build --release -p minions-watchdog
//!   cargo run -p minions-bench --bin bench_dashboard -- --workers 10,1000 --secs 20
//!
//! Prints a Markdown table (for BENCHMARKS.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use minions_schemas::messages::{EventKind, Heartbeat, InFlight, ShardEvent};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, SCHEMA_VERSION, WorkerId, encode, subjects};
use minions_tests::bench::{
    LocalSite, arg, cpu_secs, help, list, status_mb, watchdog_bin, write_bench_spec,
};
use minions_tests::out;
use minions_tests::web::{Browser, get};
use minions_tests::{Proc, Result, dashboard_url};

const SHARDS: u32 = 1_000_000;

/// Plays `n` workers until `stop`: beats spread over each second, and
/// `n / 10` shards finished (and as many started) per second.
async fn simulate(
    client: async_nats::Client,
    job: JobId,
    n: usize,
    first_shard: u32,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    let js = async_nats::jetstream::new(client.clone());
    let started_ms = now_ms();
    let ids: Vec<WorkerId> = (0..n)
        .map(|i| WorkerId::new(format!("sim{n}-{i:05}")))
        .collect::<std::result::Result<_, _>>()?;
    let mut shard = first_shard;
    let mut running: Vec<u32> = (0..n as u32).map(|i| first_shard + i).collect();
    shard += n as u32;
    let ticks_per_sec = 10;
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / ticks_per_sec));
    let mut t: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        // This tenth of the fleet beats.
        for (i, id) in ids.iter().enumerate() {
            if (i as u64) % ticks_per_sec != t % ticks_per_sec {
                continue;
            }
            let hb = Heartbeat {
                power: None,
                chip: String::new(),
                lend_mb: 0,
                v: SCHEMA_VERSION,
                worker: id.clone(),
                host: format!("mac-{i:04}"),
                device: "metal:0".into(),
                slots: 1,
                holds: 0,
                draining: false,
                leaving: false,
                owner: if i % 7 == 0 {
                    "yielded: input 12 s ago".into()
                } else {
                    "available".into()
                },
                mem_total_mb: 32_768,
                mem_avail_mb: 20_000,
                mem_budget_mb: 16_384,
                in_flight: vec![InFlight {
                    job: job.clone(),
                    shard: running[i],
                    reply: format!(
                        "$JS.ACK.MINIONS_WORK.minions-workers.1.{}.1.0.0",
                        running[i]
                    ),
                    started_ms: now_ms(),
                }],
                done: t,
                failed: 0,
                interval_ms: 1000,
                started_ms,
                at_ms: now_ms(),
                build: String::new(),
                kernel: String::new(),
                stage: None,
            };
            client
                .publish(subjects::heartbeat(id), encode("heartbeat", &hb)?.into())
                .await?;
        }
        // A tenth of a second's worth of finished shards: n / 100 per tick.
        let finishing = (n / 100).max(1);
        for k in 0..finishing {
            let i = ((t as usize) * finishing + k) % n;
            let done = running[i];
            let worker = ids[i].clone();
            let at = now_ms();
            for (s, kind) in [
                (
                    done,
                    EventKind::Done {
                        rows: 256,
                        output_bytes: 256 * 384 * 4,
                        duration_ms: 9_000 + (k as u64 * 37) % 2_000,
                        compute_ms: 8_000,
                        already_done: false,
                        sha256: "0".repeat(64),
                        tokens: 0,
                        audio_ms: 0,
                        made_by: None,
                    },
                ),
                (shard, EventKind::Started),
            ] {
                let e = ShardEvent {
                    energy: None,
                    v: SCHEMA_VERSION,
                    job: job.clone(),
                    shard: s,
                    worker: worker.clone(),
                    host: format!("mac-{i:04}"),
                    attempt: 1,
                    at_ms: at,
                    kind,
                };
                js.publish(
                    subjects::event(&job, s, &e.worker),
                    encode("shard event", &e)?.into(),
                )
                .await?;
            }
            running[i] = shard;
            shard += 1;
        }
        t += 1;
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What `--help` prints.
const USAGE: &str = "\
The watchdog and its dashboard with a large simulated fleet.

Usage: bench_dashboard [--workers N,M,...] [--secs S]
  (cargo build --release -p minions-watchdog first)

  --workers LIST   fleet sizes to measure, side by side (10,1000)
  --secs S         seconds per fleet size (20)
";

#[tokio::main]
async fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let sizes: Vec<usize> = list("--workers", "10,1000")?;
    let secs: u64 = arg("--secs").unwrap_or_else(|| "20".into()).parse()?;
    let watchdog_bin = watchdog_bin()?;
    let site = LocalSite::start("minions-bench-").await?;

    out!(
        "watchdog binary: {}  ·  {} s per fleet size  ·  {} cores",
        watchdog_bin.display(),
        secs,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    out!("");
    out!(
        "| workers | heartbeats/s | events/s | watchdog CPU (cores) | RSS MB | GET / median (max) ms | page KB | GET /metrics median ms | Chromium load median (max) ms | workers on page |"
    );
    out!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut first_shard = 0;
    for (round, &n) in sizes.iter().enumerate() {
        let job = JobId::new(format!("bench{round}"))?;
        write_bench_spec(&site.store, &job, SHARDS)?;
        // A fresh watchdog per size, seeing only this size's workers.
        site.js
            .get_stream(minions_schemas::streams::HEARTBEATS_STREAM)
            .await?
            .purge()
            .await?;
        let mut wd = Proc::spawn(
            &format!("watchdog-{n}"),
            &watchdog_bin,
            &[
                "--nats".into(),
                site.nats.url(),
                "--store".into(),
                site.store_url.clone(),
                "--listen".into(),
                // Port 0: it binds one itself and logs which.
                "127.0.0.1:0".into(),
                "--http-open".into(),
                // Its events are synthetic: no outputs to check.
                "--unchecked-results".into(),
            ],
            &[("RUST_LOG".into(), "warn,minions_watchdog::run=info".into())],
            site.dir.path(),
        )?;
        let base = dashboard_url(&mut wd, Duration::from_secs(30))?;
        let stop = Arc::new(AtomicBool::new(false));
        let sim = tokio::spawn(simulate(
            site.client.clone(),
            job.clone(),
            n,
            first_shard,
            stop.clone(),
        ));
        first_shard += 1_000_000 / sizes.len() as u32;
        // Warm up: every simulated worker has beaten.
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, body)) = get(&format!("{base}/api/fleet"))
                && body.matches("\"id\":\"sim").count() >= n
            {
                break;
            }
            if Instant::now() > until {
                return Err(format!("the watchdog never showed {n} workers").into());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let browser = Browser::start(site.dir.path())?;
        browser.open(&format!("{base}/"))?;

        let pid = u32::try_from(wd.pid())?;
        let cpu0 = cpu_secs(pid)?;
        let t0 = Instant::now();
        let mut page_ms = Vec::new();
        let mut metrics_ms = Vec::new();
        let mut page_kb = 0.0;
        let mut shown = 0;
        while t0.elapsed() < Duration::from_secs(secs) {
            let base2 = base.clone();
            let (p, m, kb, rows) = tokio::task::spawn_blocking(move || -> Result<_> {
                let a = Instant::now();
                let (_, body) = get(&format!("{base2}/"))?;
                let p = a.elapsed().as_secs_f64() * 1000.0;
                let a = Instant::now();
                get(&format!("{base2}/metrics"))?;
                let m = a.elapsed().as_secs_f64() * 1000.0;
                Ok((
                    p,
                    m,
                    body.len() as f64 / 1024.0,
                    body.matches("<tr class=\"worker\"").count(),
                ))
            })
            .await??;
            page_ms.push(p);
            metrics_ms.push(m);
            page_kb = kb;
            shown = rows;
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        let cores = (cpu_secs(pid)? - cpu0) / t0.elapsed().as_secs_f64();
        let rss = status_mb(pid, "VmRSS:")?;
        // Full loads in the browser: navigation start to load end.
        let mut load_ms = Vec::new();
        for _ in 0..5 {
            browser.open(&format!("{base}/"))?;
            let v = browser.eval(
                "var e = performance.getEntriesByType('navigation')[0]; return e.loadEventEnd - e.startTime;",
            )?;
            load_ms.push(v.as_f64().unwrap_or(f64::NAN));
        }
        drop(browser);
        stop.store(true, Ordering::Relaxed);
        sim.await??;
        wd.kill();
        let page_max = page_ms.iter().copied().fold(0.0, f64::max);
        let load_max = load_ms.iter().copied().fold(0.0, f64::max);
        let events = 2 * (n / 100).max(1) * 10;
        out!(
            "| {n} | {n} | {events} | {cores:.3} | {rss:.0} | {:.1} ({page_max:.1}) | {page_kb:.0} | {:.1} | {:.0} ({load_max:.0}) | {shown} |",
            median(&mut page_ms),
            median(&mut metrics_ms),
            median(&mut load_ms),
        );
    }
    Ok(())
}
