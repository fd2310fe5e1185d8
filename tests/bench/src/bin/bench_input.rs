//! Benchmark: `minions submit` of the same records as JSON Lines and as
//! Parquet, at two sizes: file size, time, records/s and the submit
//! process's peak memory, which should not grow with the input.
//!
//! A local fleet without workers (a real nats-server, a local-folder
//! store); the release `minions` binary submits each file as its own job.
//! Peak memory is the `ru_maxrss` of `getrusage(RUSAGE_CHILDREN)` read by a
//! wrapper process (this binary run with `--rusage`) whose only child is
//! that `minions submit`, so no other process's figure mixes in.
//!
//! Its flags are in [`USAGE`], which `--help` prints.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use minions_tests::bench::{NOOP, arg, command_line, flag, help, machine, num, utc_now};
use minions_tests::bench::{write_section, write_short};
use minions_tests::{Fleet, Result, out};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

/// What `--help` prints.
const USAGE: &str = "\
`minions submit` of JSON Lines and Parquet inputs: time, rate and peak memory.

Usage: bench_input [--rows LIST] [--group N] [--shard-size N] [--write]
  (source deploy/tools.sh --test; cargo build --release -p minions -p minions-bench --bins first)

  --rows LIST       comma-separated input sizes in records (100000,1000000)
  --group N         rows per Parquet row group (65536)
  --shard-size N    records per shard (1000)
  --write           put the Markdown into BENCHMARKS.md between its markers
";

/// The line the `--rusage` wrapper ends its output with.
const MARK: &str = "bench_input-rusage";

/// The wrapper: runs `cmd`, then prints its peak RSS (KB), its wall time
/// (s) and its exit code after whatever it printed.
fn wrapper(cmd: &[String]) -> Result<()> {
    let (program, args) = cmd.split_first().ok_or("--rusage needs a command")?;
    let t = Instant::now();
    let status = std::process::Command::new(program).args(args).status()?;
    let secs = t.elapsed().as_secs_f64();
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)?;
    out!(
        "{MARK} {} {secs} {}",
        usage.max_rss(),
        status.code().unwrap_or(-1)
    );
    Ok(())
}

/// Writes `n` records like [`write_short`]'s (`id` "r<i>", `text` "a dog
/// runs <i>") as a Parquet file, snappy, in row groups of `group` rows,
/// 65,536 rows at a time; returns the number of row groups.
fn write_parquet(path: &Path, n: usize, group: usize) -> Result<usize> {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(group))
        .set_compression(Compression::SNAPPY)
        .build();
    let mut w: Option<ArrowWriter<File>> = None;
    let mut start = 0;
    while start < n {
        let end = (start + 65_536).min(n);
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(StringArray::from_iter_values(
                    (start..end).map(|i| format!("r{i}")),
                )) as ArrayRef,
            ),
            (
                "text",
                Arc::new(StringArray::from_iter_values(
                    (start..end).map(|i| format!("a dog runs {i}")),
                )),
            ),
        ])?;
        if w.is_none() {
            w = Some(ArrowWriter::try_new(
                File::create(path)?,
                batch.schema(),
                Some(props.clone()),
            )?);
        }
        if let Some(w) = &mut w {
            w.write(&batch)?;
        }
        start = end;
    }
    let meta = w.ok_or("no rows to write")?.close()?;
    Ok(meta.num_row_groups())
}

/// One submit's figures.
struct Run {
    secs: f64,
    peak_mb: f64,
}

/// Submits `input` as job `job` through the wrapper; checks the job holds
/// `n` records.
fn submit(fleet: &Fleet, input: &Path, job: &str, n: usize, shard: u64) -> Result<Run> {
    let log = fleet.dir.path().join(format!("{job}.log"));
    let output = std::process::Command::new(std::env::current_exe()?)
        .arg("--rusage")
        .arg(minions_tests::bin("minions")?)
        .args(["submit", "--model", "noop", "--input"])
        .arg(input)
        .args([
            "--id-field",
            "id",
            "--job",
            job,
            "--shard-size",
            &shard.to_string(),
        ])
        .envs(fleet.cli_env())
        .env("RUST_LOG", "info")
        .stderr(File::create(&log)?)
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let figures: Vec<&str> = stdout
        .lines()
        .find_map(|l| l.strip_prefix(MARK))
        .ok_or_else(|| format!("the wrapper printed no figures: {stdout}"))?
        .split_whitespace()
        .collect();
    let [kb, secs, code] = figures[..] else {
        return Err(format!("bad wrapper line in {stdout}").into());
    };
    if code != "0" {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        return Err(format!("minions submit of {job} exited {code}:\n{said}").into());
    }
    let status: serde_json::Value = serde_json::from_str(&fleet.cli(&["status", job, "--json"])?)?;
    if status["records"] != n {
        return Err(format!("job {job} holds {} records, not {n}", status["records"]).into());
    }
    Ok(Run {
        secs: secs.parse()?,
        peak_mb: kb.parse::<f64>()? / 1024.0,
    })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--rusage") {
        return wrapper(&args[i + 1..]);
    }
    if help(USAGE) {
        return Ok(());
    }
    let started = Instant::now();
    let sizes: Vec<usize> = arg("--rows")
        .unwrap_or_else(|| "100000,1000000".into())
        .split(',')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    let group = num("--group", 65_536)? as usize;
    let shard = num("--shard-size", 1000)?;
    let fleet = Fleet::local()?;
    fleet.push_model("noop", NOOP)?;
    let mut rows = Vec::new();
    for &n in &sizes {
        let jsonl = fleet.dir.path().join(format!("in-{n}.jsonl"));
        write_short(&jsonl, n)?;
        let parquet = fleet.dir.path().join(format!("in-{n}.parquet"));
        let groups = write_parquet(&parquet, n, group)?;
        for (format, path, groups) in [
            ("JSON Lines", &jsonl, "".to_owned()),
            ("Parquet", &parquet, groups.to_string()),
        ] {
            let mb = std::fs::metadata(path)?.len() as f64 / 1e6;
            let job = format!("{}-{n}", if format == "Parquet" { "pq" } else { "js" });
            let r = submit(&fleet, path, &job, n, shard)?;
            out!(
                "{format}, {n} records ({mb:.1} MB): {:.2} s, {:.0} records/s, peak RSS {:.1} MB",
                r.secs,
                n as f64 / r.secs,
                r.peak_mb
            );
            rows.push(format!(
                "| {format} | {n} | {mb:.1} | {groups} | {} | {:.2} | {:.0} | {:.1} |",
                (n as u64).div_ceil(shard),
                r.secs,
                n as f64 / r.secs,
                r.peak_mb
            ));
        }
        std::fs::remove_file(&jsonl)?;
        std::fs::remove_file(&parquet)?;
    }
    let doc = format!(
        "## Submitting JSON Lines and Parquet: time and peak memory\n\n\
         Made by `source deploy/tools.sh --test && cargo build --release -p minions -p minions-bench --bins && target/release/{}` \
         on {} UTC, {}.\n\n\
         `minions submit` (release build) of the same records, `{{\"id\": \"r<i>\", \"text\": \"a dog runs <i>\"}}`, \
         as JSON Lines and as Parquet (written with arrow-rs: snappy, row groups of {group} rows, \
         two Utf8 columns `id` and `text`), `--id-field id`, shard size {shard}, a local-folder store, \
         a real nats-server, no workers: it reads the input once (Parquet: a row group at a time, in \
         batches of 4,096 rows, only the two columns), uploads each shard's input and the job spec, \
         and publishes one message per shard with confirmation. Seconds are the process's wall time. \
         Peak RSS is the process's `ru_maxrss` (`getrusage(RUSAGE_CHILDREN)` in a wrapper process \
         whose only child it is).\n\n\
         | input | records | file MB | row groups | shards | seconds | records/s | peak RSS MB |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n{}\n",
        command_line(),
        utc_now(),
        machine(),
        rows.join("\n")
    );
    out!("\n{doc}");
    if flag("--write") {
        let p = write_section("bench_input", &doc)?;
        out!("written to {}", p.display());
    }
    out!("(took {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}
