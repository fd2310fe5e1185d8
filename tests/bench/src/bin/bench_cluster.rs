//! Benchmark: the fleet on a three-server nats-server cluster.
//!
//! 1. Dispatch: shards/s of a job of near no-op shards (2 workers, 2 slots
//!    each, the store in a RAM-backed folder) on one server with one replica
//!    against three servers with three replicas, in alternating rounds of
//!    one run (R1, R3, R1, R3, ...).
//! 2. Resume: on the R3 cluster, kill -9 of the server leading the work
//!    stream (then of the one leading the work consumer) in the middle of a
//!    job: the longest pause in `done` events after the kill, i.e. how long
//!    dispatch stops, and the job's end (every shard done once). The server
//!    is restarted and caught up before the next kill.
//!
//!   source deploy/tools.sh --test
//!   cargo build --release --workspace --bins
//!   target/release/bench_cluster --write
//!
//! Prints Markdown; `--write` also puts it into BENCHMARKS.md between
//! markers. `--rounds N` (3), `--shards N` (1000), `--kills N` (2 of each).

use std::time::{Duration, Instant};

use minions_schemas::streams::WORK_STREAM;
use minions_schemas::time::now_ms;
use minions_tests::bench::{
    JobWatch, NOOP, command_line, flag, help, machine, num, utc_now, write_section, write_short,
};
use minions_tests::{Fleet, Result, cluster, out};

const USAGE: &str = "bench_cluster [--rounds N] [--shards N] [--kills N] [--write]\n\
  Dispatch on one server (R1) against three (R3), and how long dispatch\n\
  stops when a leader's server is killed. Needs NATS_SERVER_BIN (source\n\
  deploy/tools.sh --test) and the workspace's release binaries.";

/// A fleet with two workers and a warm model, its store in RAM where there
/// is one (the store's disk speed is not what is measured).
async fn fleet(replicas: usize) -> Result<(Fleet, Option<tempfile::TempDir>)> {
    let mut fleet = if replicas == 1 {
        Fleet::local()?
    } else {
        let f = Fleet::cluster(replicas).await?;
        f.cli(&["admin", "init", "--replicas", &replicas.to_string()])?;
        f
    };
    fleet
        .env
        .push(("MINIONS_REPLICAS".into(), replicas.to_string()));
    let ram = std::path::Path::new("/dev/shm");
    let kept = if ram.is_dir() {
        let d = tempfile::Builder::new()
            .prefix("minions-bench-store-")
            .tempdir_in(ram)?;
        fleet.store_url = format!("file://{}", d.path().display());
        Some(d)
    } else {
        None
    };
    fleet.push_model("noop", NOOP)?;
    fleet.add_worker(&[])?;
    fleet.add_worker(&[])?;
    let warm = fleet.dir.path().join("warm.jsonl");
    write_short(&warm, 8)?;
    run_job(&fleet, &warm, 8, "warm").await?;
    Ok((fleet, kept))
}

/// Submits `input` (`shards` one-record shards) as `job` and waits for
/// every shard; returns shards/s from submit to the last `done` event.
async fn run_job(fleet: &Fleet, input: &std::path::Path, shards: usize, job: &str) -> Result<f64> {
    let client = fleet.client().await?;
    let mut w = JobWatch::new(&client, job).await?;
    let t0 = now_ms();
    fleet.submit("noop", input, 1, job)?;
    let t1 = w.all_done(shards, Duration::from_secs(1200)).await?;
    Ok(shards as f64 / ((t1.saturating_sub(t0)).max(1) as f64 / 1000.0))
}

async fn dispatch(rounds: usize, shards: usize) -> Result<String> {
    let (r1, _r1_store) = fleet(1).await?;
    let (r3, _r3_store) = fleet(3).await?;
    let input = r1.dir.path().join("short.jsonl");
    write_short(&input, shards)?;
    let mut rows = Vec::new();
    let (mut sum1, mut sum3) = (0.0, 0.0);
    for round in 1..=rounds {
        let a = run_job(&r1, &input, shards, &format!("d{round}")).await?;
        let b = run_job(&r3, &input, shards, &format!("d{round}")).await?;
        out!("round {round}: R1 {a:.0} shards/s, R3 {b:.0} shards/s");
        rows.push(format!("| {round} | {a:.0} | {b:.0} | {:.3} |", b / a));
        sum1 += a;
        sum3 += b;
    }
    let n = rounds as f64;
    Ok(format!(
        "{shards} shards of one short text each, a near no-op model (BERT, 1 layer 8 wide), \
         2 workers with 2 slots each, the store in a RAM-backed folder. R1: one nats-server, \
         everything one replica. R3: three nats-servers routed on loopback, `minions admin init \
         --replicas 3` (streams, work consumer and registry on all three). Each shard: pulled, \
         its input read, run, output written create-only, `started` and `done` events stored \
         (on R3: by a majority), acked with confirmation. From `minions submit` starting to the \
         last `done` event; rounds alternate R1 and R3 in one run.\n\n\
         | round | R1 (shards/s) | R3 (shards/s) | R3 / R1 |\n|---:|---:|---:|---:|\n{}\n\
         | **mean** | **{:.0}** | **{:.0}** | **{:.3}** |\n",
        rows.join("\n"),
        sum1 / n,
        sum3 / n,
        (sum3 / n) / (sum1 / n)
    ))
}

async fn resume(kills: usize, shards: usize) -> Result<String> {
    let (mut fleet, _store) = fleet(3).await?;
    // As a company runs it: the watchdog publishes the schedule and hands
    // back deliveries that no worker holds after a leader change.
    fleet.add_watchdog(&[])?;
    let input = fleet.dir.path().join("short.jsonl");
    write_short(&input, shards)?;
    let client = fleet.client().await?;
    let js = async_nats::jetstream::new(client.clone());
    let mut rows = Vec::new();
    for i in 0..2 * kills {
        let what = if i % 2 == 0 {
            "work stream"
        } else {
            "work consumer"
        };
        let job = format!("kill{i}");
        let mut w = JobWatch::new(&client, &job).await?;
        fleet.submit("noop", &input, 1, &job)?;
        let until = Instant::now() + Duration::from_secs(600);
        while w.done.len() < shards / 4 {
            w.next(until).await?;
        }
        let leader = cluster::work_leader(&js, what, &job).await?;
        let before = w.done.len();
        drop(w);
        let killed = Instant::now();
        let killed_ms = now_ms();
        fleet.node(&leader)?.proc.kill();
        // The job's end, then its `done` events' times from the events
        // stream (a subscriber on the killed server would miss some).
        let status = fleet.wait_job(&job, Duration::from_secs(600))?;
        if status["state"] != "done" {
            return Err(format!("{job} ended {status}").into());
        }
        let total = killed.elapsed();
        // (time, delivery) of each `done` from the kill on. Deliveries after
        // the first are shards that were on their way to a worker when the
        // leader died: JetStream counts them delivered and sends them again
        // after the ack wait; they are reported apart from the pause.
        let done: Vec<(u64, u64)> = fleet
            .events(&job)
            .await?
            .into_iter()
            .filter(|e| matches!(e.kind, minions_schemas::messages::EventKind::Done { .. }))
            .filter(|e| e.at_ms >= killed_ms)
            .map(|e| (e.at_ms, e.attempt))
            .collect();
        let mut at: Vec<u64> = done.iter().filter(|d| d.1 == 1).map(|d| d.0).collect();
        at.sort_unstable();
        let late: Vec<u64> = done
            .iter()
            .filter(|d| d.1 > 1)
            .map(|d| d.0 - killed_ms)
            .collect();
        let late_by = late.iter().max().copied().unwrap_or(0) as f64 / 1000.0;
        let first_after = at.first().map_or(0, |t| t - killed_ms);
        let longest = at
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
            .max(first_after);
        fleet.node(&leader)?.start_again()?;
        cluster::wait_current(&js, WORK_STREAM, Duration::from_secs(120)).await?;
        let caught_up = killed.elapsed();
        let (longest, first_after) = (longest as f64 / 1000.0, first_after as f64 / 1000.0);
        out!(
            "kill -9 of {leader} ({what} leader) at {before}/{shards} done: longest pause {longest:.2} s, \
             first done after {first_after:.2} s, {} shards redelivered (last done {late_by:.1} s after), \
             job ended {:.1} s after the kill; restarted and current {:.1} s after",
            late.len(),
            total.as_secs_f64(),
            caught_up.as_secs_f64()
        );
        rows.push(format!(
            "| {} | {what} | {leader} | {before} | **{longest:.2}** | {first_after:.2} | {} ({late_by:.1}) | {:.1} | {:.1} |",
            i + 1,
            late.len(),
            total.as_secs_f64(),
            caught_up.as_secs_f64()
        ));
    }
    Ok(format!(
        "Three servers, R3, a watchdog and 2 workers (2 slots each), jobs of {shards} no-op shards. When a \
         quarter of a job is done, the server leading the work stream (or the work consumer) \
         is killed with SIGKILL. Longest pause: the longest time between two `done` events \
         (their times as the workers stamp them, read back from the events stream) from the \
         kill to the job's end, leaving out shards delivered again, which is how long shards \
         stopped completing. Redelivered: shards delivered again after the kill: ones on \
         their way from the killed server to a worker, and ones whose ack was lost with it \
         (the redelivery finds the output and acks); JetStream sends them again after the \
         ack wait (60 s) unless the watchdog hands them back first (it does, after a consumer \
         leader changes, for deliveries no live worker reports holding). In brackets, when \
         the last of them was done, seconds after the kill. The server is \
         started again after the job ends, and the next kill waits until its copy of the \
         work stream is current.\n\n\
         | kill | leader of | server | shards done before | longest pause (s) | first `done` after (s) | redelivered (last done after, s) | job ended after (s) | restarted and current after (s) |\n\
         |---:|---|---|---:|---:|---:|---:|---:|---:|\n{}\n",
        rows.join("\n")
    ))
}

#[tokio::main]
async fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let started = Instant::now();
    let rounds = num("--rounds", 3)? as usize;
    let shards = num("--shards", 1000)? as usize;
    let kills = num("--kills", 2)? as usize;
    let mut doc = format!(
        "## A three-server cluster: dispatch on R3 against R1, resuming after a leader is killed\n\n\
         Made by `source deploy/tools.sh --test && cargo build --release --workspace --bins && \
         target/release/{}` on {} UTC, {}.\n\n",
        command_line(),
        utc_now(),
        machine()
    );
    doc.push_str("### Dispatch: R3 against R1\n\n");
    doc.push_str(&dispatch(rounds, shards).await?);
    doc.push_str("\n### Resuming after a leader's server is killed\n\n");
    doc.push_str(&resume(kills, shards * 3).await?);
    out!("\n{doc}");
    if flag("--write") {
        let p = write_section("bench_cluster", &doc)?;
        out!("written to {}", p.display());
    }
    out!("(took {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}
