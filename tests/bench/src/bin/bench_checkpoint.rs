//! Benchmark: how long a restarted watchdog takes to catch up with the
//! events stream, replaying all of it against resuming from a checkpoint.
//!
//! For each size it fills a real nats-server's events stream with that many
//! synthetic shard events (jobs of 1,000 shards; each shard `started` then
//! `done`, one in 30 handed back and started again first; async publishes,
//! thousands in flight), then, in rounds side by side: starts the release
//! `minions-watchdog` with `--no-checkpoints` (a full replay) and times it
//! from spawn to its `events caught up` line; publishes a tail of events;
//! starts a watchdog that resumes from the newest checkpoint and times it
//! the same way.
//!
//!   cargo build --release -p minions-watchdog
//!   cargo run --release -p minions-bench --bin bench_checkpoint -- --events 1000000,10000000
//!
//! Prints a Markdown table (for BENCHMARKS.md).

use std::path::Path;
use std::time::{Duration, Instant};

use minions_schemas::messages::{EventKind, ShardEvent};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, SCHEMA_VERSION, WorkerId};
use minions_tests::bench::{
    EventPublisher, LocalSite, bench_done, help, list, machine, num, status_mb, utc_now,
    watchdog_bin, write_bench_spec,
};
use minions_tests::out;
use minions_tests::{NatsServer, Proc, Result};

const SHARDS_PER_JOB: u32 = 1_000;
/// Acknowledgements outstanding (below async-nats's default cap of 5,000
/// unacknowledged publishes per context).
const IN_FLIGHT: usize = 4_096;
const WORKERS: u32 = 300;

/// Publishes about `n` events of jobs `bench-<first>`, `bench-<first+1>`...
/// (specs written into `store`); returns the next job number.
async fn fill(p: &mut EventPublisher, store: &Path, first: u32, n: u64) -> Result<u32> {
    let until = p.sent + n;
    let mut job_no = first;
    let t0 = now_ms();
    while p.sent < until {
        let job = JobId::new(format!("bench-{job_no:06}"))?;
        write_bench_spec(store, &job, SHARDS_PER_JOB)?;
        for shard in 0..SHARDS_PER_JOB {
            if p.sent >= until {
                break;
            }
            let w = (job_no * 7 + shard) % WORKERS;
            let worker = WorkerId::new(format!("mac-{w:04}-1a2b3c"))?;
            let host = format!("mac-{w:04}");
            let at = t0 + p.sent;
            let ev = |attempt: u64, kind: EventKind| ShardEvent {
                energy: None,
                v: SCHEMA_VERSION,
                job: job.clone(),
                shard,
                worker: worker.clone(),
                host: host.clone(),
                attempt,
                at_ms: at,
                kind,
            };
            let mut attempt = 1;
            p.send(&ev(1, EventKind::Started)).await?;
            if shard % 30 == 7 {
                p.send(&ev(
                    1,
                    EventKind::HandedBack {
                        reason: "owner: input 0 s ago".into(),
                    },
                ))
                .await?;
                attempt = 2;
                p.send(&ev(2, EventKind::Started)).await?;
            }
            let h = u64::from(job_no) << 32 | u64::from(shard);
            p.send(&ev(attempt, bench_done(h))).await?;
        }
        job_no += 1;
    }
    p.drain().await?;
    Ok(job_no)
}

/// A watchdog's start: spawn to `events caught up`, what its log says.
struct Start {
    secs: f64,
    from_seq: u64,
    events: u64,
    restore_ms: u64,
    rss_mb: f64,
}

fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
}

fn wait_line(log: &Path, needle: &str, within: Duration) -> Result<String> {
    let until = Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains(needle)) {
            return Ok(l.to_owned());
        }
        if Instant::now() > until {
            return Err(format!("no {needle:?} in {} within {within:?}", log.display()).into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts a watchdog, times it to `events caught up`; with `keep` it then
/// waits for its checkpoint and stops it cleanly, else it is killed.
fn start(
    watchdog: &Path,
    nats: &NatsServer,
    store_url: &str,
    dir: &Path,
    name: &str,
    extra: &[&str],
    keep: bool,
) -> Result<Start> {
    let mut args: Vec<String> = vec![
        "--nats".into(),
        nats.url(),
        "--store".into(),
        store_url.into(),
        "--listen".into(),
        "off".into(),
        "--name".into(),
        name.into(),
        // Its events are synthetic: no outputs to check.
        "--unchecked-results".into(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let t0 = Instant::now();
    let mut p = Proc::spawn(
        name,
        watchdog,
        &args,
        &[("RUST_LOG".into(), "info".into())],
        dir,
    )?;
    let caught = wait_line(&p.log, "events caught up", Duration::from_secs(3600))?;
    let secs = t0.elapsed().as_secs_f64();
    let rss_mb = status_mb(u32::try_from(p.pid())?, "VmRSS:")?;
    let text = std::fs::read_to_string(&p.log)?;
    let resumed = text
        .lines()
        .find(|l| l.contains("resuming from checkpoint"));
    let s = Start {
        secs,
        from_seq: resumed.and_then(|l| field(l, "seq")).unwrap_or(0),
        events: field(&caught, "events").unwrap_or(0),
        restore_ms: resumed.and_then(|l| field(l, "restore_ms")).unwrap_or(0),
        rss_mb,
    };
    if keep {
        wait_line(&p.log, "checkpoint written", Duration::from_secs(3600))?;
        p.signal(nix::sys::signal::Signal::SIGTERM)?;
        p.wait_timeout(Duration::from_secs(600))?;
    } else {
        p.kill();
    }
    Ok(s)
}

/// The size of the newest checkpoint in the store, MB.
fn checkpoint_mb(store: &Path) -> f64 {
    let dir = store.join(minions_schemas::keys::WATCHDOG_CHECKPOINTS);
    std::fs::read_dir(dir)
        .ok()
        .and_then(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| Some((e.file_name(), e.metadata().ok()?.len())))
                .max()
        })
        .map_or(0.0, |(_, len)| len as f64 / 1e6)
}

const USAGE: &str = "\
A restarted watchdog: full replay of the events stream against resuming
from a checkpoint near its end.

Usage: bench_checkpoint [--events N,M,...] [--tail T] [--rounds R]
  (cargo build --release -p minions-watchdog first)

  --events LIST   events-stream sizes, each in a fresh nats-server (1000000,10000000)
  --tail T        events published after the checkpoint, per round (10000)
  --rounds R      full-replay / checkpoint pairs per size (2)
";

#[tokio::main]
async fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let sizes: Vec<u64> = list("--events", "1000000,10000000")?;
    let tail = num("--tail", 10_000)?;
    let rounds = num("--rounds", 2)?;
    let watchdog = watchdog_bin()?;
    out!("{} · {} · {}", utc_now(), machine(), watchdog.display());
    out!("");
    let mut rows = Vec::new();
    for &n in &sizes {
        let LocalSite {
            js,
            store_url,
            store,
            nats,
            dir,
            ..
        } = LocalSite::start("minions-bench-ckpt-").await?;
        let mut p = EventPublisher::new(js, IN_FLIGHT, None);
        let t0 = Instant::now();
        let mut next_job = fill(&mut p, &store, 0, n).await?;
        let fill_secs = t0.elapsed().as_secs_f64();
        out!(
            "{n} events: filled in {fill_secs:.1} s ({:.0} events/s)",
            n as f64 / fill_secs
        );
        // The first checkpoint: a watchdog replays everything once.
        let first = start(
            &watchdog,
            &nats,
            &store_url,
            dir.path(),
            "wd-first",
            &[],
            true,
        )?;
        out!(
            "  first start (writes the checkpoint): {:.1} s, {} events",
            first.secs,
            first.events
        );
        for r in 0..rounds {
            let full = start(
                &watchdog,
                &nats,
                &store_url,
                dir.path(),
                &format!("wd-full-{r}"),
                &["--no-checkpoints"],
                false,
            )?;
            next_job = fill(&mut p, &store, next_job, tail).await?;
            let ck = start(
                &watchdog,
                &nats,
                &store_url,
                dir.path(),
                &format!("wd-ckpt-{r}"),
                &[],
                true,
            )?;
            let mb = checkpoint_mb(&store);
            out!(
                "  round {r}: full replay {:.2} s ({} events, RSS {:.0} MB) · checkpoint at {} + tail {:.2} s ({} events, restore {} ms, RSS {:.0} MB, {mb:.0} MB file)",
                full.secs,
                full.events,
                full.rss_mb,
                ck.from_seq,
                ck.secs,
                ck.events,
                ck.restore_ms,
                ck.rss_mb
            );
            rows.push((n, fill_secs, full, ck, mb));
        }
    }
    out!("");
    out!(
        "| events in stream | fill s | full replay s | checkpoint + tail s | tail events | restore ms | checkpoint MB | speed-up | RSS full / checkpoint MB |"
    );
    out!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (n, fill_secs, full, ck, mb) in rows {
        out!(
            "| {n} | {fill_secs:.0} | {:.2} | {:.2} | {} | {} | {mb:.0} | {:.1}× | {:.0} / {:.0} |",
            full.secs,
            ck.secs,
            ck.events,
            ck.restore_ms,
            full.secs / ck.secs,
            full.rss_mb,
            ck.rss_mb
        );
    }
    Ok(())
}
