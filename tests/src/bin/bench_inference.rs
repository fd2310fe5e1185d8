//! Benchmark: the worker's inference next to sentence-transformers (PyTorch)
//! on the same machine, texts and model, in one run.
//!
//! all-MiniLM-L6-v2 over real English texts of 10–600 characters (CPython's
//! bundled reference documentation, cut by `tests/bench/texts.py`). The
//! reference (`tests/bench/reference.py`) runs right before and right after
//! Minions' own model code; the ratio is against the mean of its two runs.
//! Outputs are compared row by row: max abs difference and mean cosine.
//!
//!   bash tests/bench/inference.sh          # installs, builds, runs, writes
//!
//! which runs, after installing sentence-transformers into `.tools/bench-venv`:
//!
//!   target/release/bench_inference --python .tools/bench-venv/bin/python --write
//!
//! Its flags are in [`USAGE`], which `--help` prints.

use std::path::Path;
use std::time::Instant;

use candle_core::Device;
use minions_tests::bench::{
    arg, bench_python, bench_texts, flag, help, machine, num, utc_now, write_section,
};
use minions_tests::{Result, out, real_model_dir, workspace_root};
use minions_worker::model::{
    Batching, BertEmbedder, DeviceChoice, Precision, describe_device, select_device,
};

/// One throughput measurement and the vectors it produced.
struct Run {
    name: String,
    texts_per_s: f64,
    vectors: Vec<f32>,
}

/// Runs `tests/bench/reference.py` once.
fn reference(
    python: &Path,
    model: &Path,
    texts: &Path,
    batch: u64,
    threads: u64,
    torch_device: &str,
) -> Result<Run> {
    let dir = tempfile::tempdir()?;
    let vectors = dir.path().join("vectors.f32");
    let script = workspace_root().join("tests/bench/reference.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(model)
        .arg(texts)
        .arg(&vectors)
        .args([
            "--batch",
            &batch.to_string(),
            "--threads",
            &threads.to_string(),
            "--device",
            torch_device,
        ])
        .stderr(std::process::Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status).into());
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("reference.py printed {line:?}: {e}"))?;
    let bytes = std::fs::read(&vectors)?;
    Ok(Run {
        name: report["name"].as_str().unwrap_or("reference").to_owned(),
        texts_per_s: report["texts_per_s"].as_f64().ok_or("no texts_per_s")?,
        vectors: bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    })
}

/// Times `embed` over all texts after one warm-up batch: in one call, or
/// with `--shard N`, N texts per call, as a worker runs a job's shards.
fn ours(name: &str, model: &BertEmbedder, texts: &[String], batch: Batching) -> Result<Run> {
    model.embed(&texts[..batch.max_texts.min(texts.len())], batch)?;
    let shard = match num("--shard", 0)? {
        0 => texts.len().max(1),
        s => s as usize,
    };
    let t = Instant::now();
    let mut vectors = Vec::new();
    for chunk in texts.chunks(shard) {
        vectors.extend(model.embed(chunk, batch)?);
    }
    Ok(Run {
        name: name.to_owned(),
        texts_per_s: texts.len() as f64 / t.elapsed().as_secs_f64(),
        vectors,
    })
}

/// Max abs difference and mean cosine of `a`'s rows against `b`'s.
fn compare(a: &[f32], b: &[f32], dim: usize) -> Result<(f64, f64)> {
    if a.len() != b.len() || dim == 0 {
        return Err(format!("{} values against {}", a.len(), b.len()).into());
    }
    let mut max = 0f64;
    let mut cos = 0f64;
    let rows = a.len() / dim;
    for (x, y) in a.chunks_exact(dim).zip(b.chunks_exact(dim)) {
        let (mut dot, mut nx, mut ny) = (0f64, 0f64, 0f64);
        for (&p, &q) in x.iter().zip(y) {
            max = max.max(f64::from((p - q).abs()));
            dot += f64::from(p) * f64::from(q);
            nx += f64::from(p) * f64::from(p);
            ny += f64::from(q) * f64::from(q);
        }
        cos += dot / (nx.sqrt() * ny.sqrt()).max(1e-30);
    }
    Ok((max, cos / rows as f64))
}

/// The flags this run was given, less `--python` (a machine path) and
/// `--write`, each with a leading space.
fn flags_shown() -> String {
    let mut shown = String::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--python" => {
                args.next();
            }
            "--write" => {}
            _ => {
                shown.push(' ');
                shown.push_str(&a);
            }
        }
    }
    shown
}

/// `--ours-only`: our precisions alone, for profiling; int8 is compared
/// with f32.
fn ours_only(model_dir: &Path, device: &Device, texts: &[String], batch: Batching) -> Result<()> {
    let mut runs = Vec::new();
    let only = arg("--precision");
    for precision in [Precision::F32, Precision::Int8] {
        if only.as_deref().is_some_and(|p| p != precision.as_str()) {
            continue;
        }
        let model = BertEmbedder::load(model_dir, device, precision)?;
        let r = ours(precision.as_str(), &model, texts, batch)?;
        out!("{}: {:.1} texts/s", r.name, r.texts_per_s);
        runs.push((r, model.dim()));
    }
    if let [(f, dim), (q, _)] = &runs[..] {
        let (max, cos) = compare(&q.vectors, &f.vectors, *dim)?;
        out!("int8 against f32: max abs diff {max:.2e}, mean cosine {cos:.6}");
    }
    Ok(())
}

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What `--help` prints.
const USAGE: &str = "\
Minions' model code next to sentence-transformers on this machine, in one run.

Usage: bench_inference [--python PATH] [--write] [FLAGS]
  (bash tests/bench/inference.sh installs sentence-transformers, builds, runs, writes)

  --texts N          texts to embed (3000)
  --batch B          sentence-transformers' batch (64)
  --our-batch B      our passes: at most B texts each (the worker's default)
  --batch-tokens T   our passes: at most T tokens each, padding included (the worker's default)
  --threads T        PyTorch's threads; 0 = cores (0)
  --device D         cpu (default), metal or cuda: ours on that device, sentence-transformers
                     on PyTorch's matching one (mps, cuda); metal and cuda need this binary
                     built with --features minions-worker/metal or minions-worker/cuda
  --python PATH      a Python with sentence-transformers
  --ours-only        our precisions only, no reference runs (for profiling)
  --precision P      with --ours-only: f32 or int8 alone
  --shard N          our code embeds N texts per call, as a worker per shard (all in one)
  --write            put the Markdown into BENCHMARKS.md between its markers
";

fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    minions_worker::process_env::fix_process_env();
    let started = Instant::now();
    let n = num("--texts", 3000)?;
    let batch = num("--batch", 64)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let threads = match num("--threads", 0)? {
        0 => cores,
        t => t,
    };
    // Without the venv, `--ours-only` needs Python only to cut the texts.
    let python = bench_python();
    let model_dir = real_model_dir()?;
    let dir = tempfile::tempdir()?;
    let (texts_path, texts) = bench_texts(&python, n, dir.path())?;

    let ours_batch = Batching {
        max_texts: num("--our-batch", Batching::DEFAULT_TEXTS as u64)?.max(1) as usize,
        max_tokens: num("--batch-tokens", Batching::DEFAULT_TOKENS as u64)?.max(1) as usize,
    };
    // Ours on the asked device; the reference on PyTorch's name for it.
    let (device, torch_device) = match arg("--device").as_deref().unwrap_or("cpu") {
        "cpu" => (Device::Cpu, "cpu"),
        "metal" => (select_device(DeviceChoice::Metal)?, "mps"),
        "cuda" => (select_device(DeviceChoice::Cuda)?, "cuda"),
        other => return Err(format!("--device {other}: expected cpu, metal or cuda").into()),
    };
    if flag("--ours-only") {
        return ours_only(&model_dir, &device, &texts, ours_batch);
    }
    let on = match &device {
        Device::Cpu => "CPU".to_owned(),
        Device::Metal(_) => "Metal".to_owned(),
        d => describe_device(d),
    };
    let reference = || {
        reference(
            &python,
            &model_dir,
            &texts_path,
            batch,
            threads,
            torch_device,
        )
    };
    let before = reference()?;
    out!("{}: {:.1} texts/s", before.name, before.texts_per_s);
    let mut runs = Vec::new();
    let mut dim = 0;
    for precision in [Precision::F32, Precision::Int8] {
        let model = BertEmbedder::load(&model_dir, &device, precision)?;
        dim = model.dim();
        let name = format!("Minions worker ({}, {on})", precision.as_str());
        let r = ours(&name, &model, &texts, ours_batch)?;
        out!("{}: {:.1} texts/s", r.name, r.texts_per_s);
        runs.push(r);
    }
    let after = reference()?;
    out!("{}: {:.1} texts/s", after.name, after.texts_per_s);
    let base = (before.texts_per_s + after.texts_per_s) / 2.0;

    let mut rows = vec![format!(
        "| {} | {base:.1} ({:.1}, {:.1}) | 1.000 | 0 | 1.000000 |",
        before.name, before.texts_per_s, after.texts_per_s
    )];
    for r in &runs {
        let (max, cos) = compare(&r.vectors, &before.vectors, dim)?;
        out!(
            "{}: ratio {:.3}, max abs diff {max:.2e}, mean cosine {cos:.6}",
            r.name,
            r.texts_per_s / base
        );
        rows.push(format!(
            "| {} | {:.1} | **{:.3}** | {max:.1e} | {cos:.6} |",
            r.name,
            r.texts_per_s,
            r.texts_per_s / base
        ));
    }
    let lens: Vec<usize> = texts.iter().map(|t| t.chars().count()).collect();
    let doc = format!(
        "## Inference against sentence-transformers\n\n\
         Made by `bash tests/bench/inference.sh{}` on {} UTC, {}.\n\n\
         all-MiniLM-L6-v2 (sentence-transformers in f32), {} texts of {}–{} characters from CPython's bundled reference \
         documentation, {threads} threads. sentence-transformers runs batches of {batch} texts; ours \
         runs passes of at most {} texts and {} tokens, as a worker does by default. \
         sentence-transformers runs right \
         before and right after ours (texts/s: mean (before, after)); the ratio is against the \
         mean. Differences are against the first reference run's vectors, row by row.\n\n\
         | what | texts/s | ratio | max abs diff | mean cosine |\n|---|---:|---:|---:|---:|\n{}\n",
        flags_shown(),
        utc_now(),
        machine(),
        texts.len(),
        lens.iter().min().unwrap_or(&0),
        lens.iter().max().unwrap_or(&0),
        ours_batch.max_texts,
        ours_batch.max_tokens,
        rows.join("\n")
    );
    out!("\n{doc}");
    if flag("--write") {
        let p = write_section("bench_inference", &doc)?;
        out!("written to {}", p.display());
    }
    out!("(took {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}
