//! Benchmark: what sampled checks cost. The same texts run as jobs with
//! `--verify 0` and `--verify 0.02`, alternated in one run on one fleet
//! (real nats-server, watchdog, workers and the real all-MiniLM-L6-v2), so
//! that drift in the machine's speed falls on both alike. A job's time runs
//! from `minions submit` starting to `minions status` saying done, which
//! for a checked job includes its open checks closing.
//!
//! The target: a checked job takes at most 3 % longer than its extra
//! compute (the check runs over the shards) explains.
//!
//!   source deploy/tools.sh --test   # nats-server and the real model
//!   cargo build --release --workspace --bins
//!   target/release/bench_verify --write
//!
//! Flags: `--texts N` (4096), `--shard N` (16 texts per shard), `--workers N`
//! (2), `--rounds N` (3 pairs of jobs), `--verify RATE` (0.02). Prints
//! Markdown; `--write` also puts it into BENCHMARKS.md between markers.

use std::time::{Duration, Instant};

use minions_schemas::messages::EventKind;
use minions_tests::bench::{
    arg, command_line, flag, help, machine, num, utc_now, wait_workers, write_section,
};
use minions_tests::out;
use minions_tests::{Fleet, Result, real_model_dir, write_corpus};

const USAGE: &str =
    "bench_verify [--texts N] [--shard N] [--workers N] [--rounds N] [--verify RATE] [--write]";

/// Runs one job; returns its seconds and its check runs (rounds 1 and 2).
async fn run_job(
    fleet: &Fleet,
    input: &std::path::Path,
    job: &str,
    shard: u64,
    verify: &str,
) -> Result<(f64, usize)> {
    let started = Instant::now();
    fleet.cli(&[
        "submit",
        "--model",
        "minilm",
        "--input",
        &input.display().to_string(),
        "--job",
        job,
        "--shard-size",
        &shard.to_string(),
        "--verify",
        verify,
    ])?;
    let status = fleet.wait_job(job, Duration::from_secs(3600))?;
    let secs = started.elapsed().as_secs_f64();
    if status["state"] != "done" {
        return Err(format!("job {job} ended {status}").into());
    }
    let checks = fleet
        .events(job)
        .await?
        .iter()
        .filter(|e| matches!(e.kind, EventKind::CheckQueued { .. }))
        .count();
    Ok((secs, checks))
}

#[tokio::main]
async fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let texts_n = num("--texts", 4096)? as usize;
    let shard = num("--shard", 16)?;
    let workers = num("--workers", 2)? as usize;
    let rounds = num("--rounds", 3)? as usize;
    let rate = arg("--verify").unwrap_or_else(|| "0.02".to_owned());
    let started = Instant::now();
    let command = command_line();

    let model_dir = real_model_dir()?;
    let mut fleet = Fleet::local()?;
    fleet.cli(&[
        "model",
        "push",
        &model_dir.display().to_string(),
        "--name",
        "minilm",
    ])?;
    let input = fleet.dir.path().join("texts.jsonl");
    write_corpus(&input, texts_n)?;
    let warm = fleet.dir.path().join("warm.jsonl");
    write_corpus(&warm, 64)?;
    fleet.add_watchdog(&["--verify-key", "bench secret"])?;
    for _ in 0..workers {
        fleet.add_worker(&["--max-batch", "32", "--slots", "1"])?;
    }
    wait_workers(&fleet, workers)?;
    run_job(&fleet, &warm, "warm", 16, "0").await?;

    let shards = texts_n.div_ceil(shard as usize);
    let mut plain = Vec::new();
    let mut checked = Vec::new();
    let mut checks = 0;
    let mut rows = Vec::new();
    for r in 0..rounds {
        // Alternate which goes first, so that a trend in the machine's
        // speed does not favour one.
        let order: [(&str, &str); 2] = if r % 2 == 0 {
            [("plain", "0"), ("checked", rate.as_str())]
        } else {
            [("checked", rate.as_str()), ("plain", "0")]
        };
        for (kind, verify) in order {
            let job = format!("{kind}-{r}");
            let (secs, n) = run_job(&fleet, &input, &job, shard, verify).await?;
            out!("{job}: {secs:.1} s, {n} check runs");
            rows.push(format!(
                "| {r} | `--verify {verify}` | {secs:.2} | {:.1} | {n} |",
                texts_n as f64 / secs
            ));
            if kind == "plain" {
                plain.push(secs);
            } else {
                checked.push(secs);
                checks += n;
            }
        }
    }
    let plain_s: f64 = plain.iter().sum();
    let checked_s: f64 = checked.iter().sum();
    let extra = checks as f64 / (shards * rounds) as f64;
    let slower = checked_s / plain_s - 1.0;
    let beyond = slower - extra;
    let doc = format!(
        "## The cost of sampled checks (`--verify`)\n\n\
         Made by `source deploy/tools.sh --test && cargo build --release --workspace --bins && target/release/{command}` \
         on {} UTC, {}.\n\n\
         {texts_n} texts in shards of {shard} ({shards} shards), all-MiniLM-L6-v2 (f32, CPU), {workers} workers \
         (1 slot, batch 32), one watchdog; jobs with `--verify 0` and `--verify {rate}` alternated, {rounds} of each. \
         A job's time: `minions submit` starting to `minions status` saying done (open checks closed).\n\n\
         | round | job | seconds | texts/s | check runs |\n|---:|---|---:|---:|---:|\n{}\n\n\
         - Total: `--verify 0` {plain_s:.2} s, `--verify {rate}` {checked_s:.2} s: the checked jobs took \
         **{:.1} %** longer.\n\
         - Extra compute: {checks} check runs over {} shards = {:.1} %.\n\
         - Beyond the extra compute: **{:.1} %** (target: at most 3 %).\n",
        utc_now(),
        machine(),
        rows.join("\n"),
        100.0 * slower,
        shards * rounds,
        100.0 * extra,
        100.0 * beyond,
    );
    out!("\n{doc}");
    if flag("--write") {
        let p = write_section("bench_verify", &doc)?;
        out!("written to {}", p.display());
    }
    out!("(took {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}
