//! Benchmark: one embedding job end to end, Minions against Ray Data, on the
//! same machine, texts and model, in one run.
//!
//! all-MiniLM-L6-v2 over the texts of the inference benchmark
//! (`tests/bench/texts.py`). Ray Data (`tests/bench/ray_reference.py`) runs
//! W actors of sentence-transformers, one CPU each, right before and right
//! after Minions; the ratio is against the mean of its two runs. Minions
//! runs W workers (one CPU thread each) of a local fleet: its own
//! nats-server and store, the model pushed to the store; the clock covers
//! `minions submit` to the job's `done` state, model fetch and load
//! included (the workers are up, as Ray's cluster is). Then the same job in
//! int8.
//!
//!   bash tests/bench/e2e.sh            # installs Ray, builds, runs, writes
//!
//! Its flags are in [`USAGE`], which `--help` prints.

use std::path::Path;
use std::time::Instant;

use minions_tests::bench::{
    bench_python, bench_texts, flag, help, job, machine, num, utc_now, wait_workers, write_section,
};
use minions_tests::{Fleet, Result, out, real_model_dir, workspace_root};

/// Runs `tests/bench/ray_reference.py` once: its name and texts/s.
fn ray(
    python: &Path,
    model: &Path,
    texts: &Path,
    actors: u64,
    batch: u64,
) -> Result<(String, f64)> {
    let script = workspace_root().join("tests/bench/ray_reference.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(model)
        .arg(texts)
        .args([
            "--actors",
            &actors.to_string(),
            "--batch",
            &batch.to_string(),
        ])
        .stderr(std::process::Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status).into());
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let last = line.lines().last().unwrap_or_default();
    let report: serde_json::Value = serde_json::from_str(last)
        .map_err(|e| format!("ray_reference.py printed {line:?}: {e}"))?;
    Ok((
        report["name"].as_str().unwrap_or("Ray Data").to_owned(),
        report["texts_per_s"].as_f64().ok_or("no texts_per_s")?,
    ))
}

/// What `--help` prints.
const USAGE: &str = "\
One embedding job end to end: Minions against Ray Data, same machine, texts and model.

Usage: bench_e2e [--python PATH] [--write] [FLAGS]
  (bash tests/bench/e2e.sh installs Ray, builds, runs, writes)

  --texts N        texts to embed (3000)
  --workers W      Minions workers and Ray actors (2)
  --shard-size S   texts per shard (256, the default of `minions submit`)
  --batch B        Ray's batch (64)
  --python PATH    a Python with sentence-transformers and Ray Data
  --write          put the Markdown into BENCHMARKS.md between its markers
";

fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let started = Instant::now();
    let n = num("--texts", 3000)?;
    let workers = num("--workers", 2)?;
    let shard = num("--shard-size", 256)?;
    let batch = num("--batch", 64)?;
    let python = bench_python();
    let model_dir = real_model_dir()?;
    let dir = tempfile::tempdir()?;
    let (texts_path, texts) = bench_texts(&python, n, dir.path())?;

    let (ray_name, before) = ray(&python, &model_dir, &texts_path, workers, batch)?;
    out!("{ray_name}: {before:.1} texts/s");

    let mut fleet = Fleet::local()?;
    fleet
        .worker_env
        .push(("RAYON_NUM_THREADS".into(), "1".into()));
    fleet.cli(&[
        "model",
        "push",
        &model_dir.display().to_string(),
        "--name",
        "minilm",
    ])?;
    for _ in 0..workers {
        fleet.add_worker(&[])?;
    }
    wait_workers(&fleet, workers as usize)?;
    let mut ours = Vec::new();
    for precision in ["f32", "int8"] {
        let name = format!("e2e-{precision}");
        let rate = job(&fleet, &texts_path, texts.len(), &name, shard, precision)?;
        out!("Minions, {workers} workers ({precision}): {rate:.1} texts/s");
        ours.push((precision, rate));
    }
    drop(fleet);

    let (_, after) = ray(&python, &model_dir, &texts_path, workers, batch)?;
    out!("{ray_name}: {after:.1} texts/s");
    let base = (before + after) / 2.0;
    let mut rows = vec![format!(
        "| {ray_name} | {base:.1} ({before:.1}, {after:.1}) | 1.000 |"
    )];
    for (precision, rate) in &ours {
        out!("Minions ({precision}): ratio {:.3}", rate / base);
        rows.push(format!(
            "| Minions, {workers} workers of 1 thread ({precision}), shards of {shard} | {rate:.1} | **{:.3}** |",
            rate / base
        ));
    }
    let doc = format!(
        "## A job end to end against Ray Data\n\n\
         Made by `bash tests/bench/e2e.sh` on {} UTC, {}.\n\n\
         all-MiniLM-L6-v2, the {} texts of the inference benchmark. Ray Data: {workers} actors, \
         one CPU each, batches of {batch}, timed from building the dataset to every vector in the \
         driver (after `ray.init`), run right before and right after Minions (texts/s: mean \
         (before, after)). Minions: a local fleet (nats-server, local-directory store) with \
         {workers} workers already up, timed from `minions submit` to the job's `done` state; \
         model fetch and load are inside both clocks. The ratio is against Ray's mean.\n\n\
         | what | texts/s | ratio |\n|---|---:|---:|\n{}\n",
        utc_now(),
        machine(),
        texts.len(),
        rows.join("\n")
    );
    out!("\n{doc}");
    if flag("--write") {
        let p = write_section("bench_e2e", &doc)?;
        out!("written to {}", p.display());
    }
    out!("(took {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}
