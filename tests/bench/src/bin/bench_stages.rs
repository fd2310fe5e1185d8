//! Benchmark: what one stage of a language model split by layers holds.
//! Each stage of SmolLM2-135M-Instruct Q4_1 (30 layers) is loaded in a
//! process of its own (this binary again, `--one A B`) and its resident
//! memory read before and after the load: a stage should hold about its
//! share of the weights, plus the embeddings on the first and the head on
//! the last.
//!
//!   cargo run -p minions-bench --bin bench_stages -- --write
//!
//! Its flags are in [`USAGE`], which `--help` prints.

use candle_core::Device;
use minions_tests::bench::{arg, flag, help, machine, utc_now, write_section};
use minions_tests::{Result, out, real_gguf};
use minions_worker::model::EnginePath;
use minions_worker::model::llm::gguf::GgufFile;
use minions_worker::model::llm::llama::Llama;

/// What `--help` prints.
const USAGE: &str = "\
A language model split by layers: resident memory of each stage, each loaded in its own process.

Usage: bench_stages [--write]
  --write       put the Markdown into BENCHMARKS.md between its markers
  --one A B     (internal) load layers A..B here and print the memory
";

/// The splits measured, as stage bounds over the model's 30 layers.
const SPLITS: [&[usize]; 4] = [&[0, 30], &[0, 15, 30], &[0, 7, 30], &[0, 10, 20, 30]];

/// Resident memory of this process in MB.
fn rss_mb() -> Result<f64> {
    minions_tests::bench::status_mb(std::process::id(), "VmRSS:")
}

/// Loads layers `a..b` and prints the resident MB before and after.
fn one(a: usize, b: usize) -> Result<()> {
    let before = rss_mb()?;
    let mut file = GgufFile::open(&real_gguf()?)?;
    let stage = Llama::load_stage(&mut file, &Device::Cpu, EnginePath::Fast, a..b)?;
    let after = rss_mb()?;
    drop(stage);
    out!("{before:.1} {after:.1}");
    Ok(())
}

/// Runs `--one a b` in a child; the MB the stage holds.
fn measure(a: usize, b: usize) -> Result<f64> {
    let child = std::process::Command::new(std::env::current_exe()?)
        .args(["--one", &a.to_string(), &b.to_string()])
        .output()?;
    if !child.status.success() {
        return Err(format!("stage {a}..{b}: {}", String::from_utf8_lossy(&child.stderr)).into());
    }
    let text = String::from_utf8_lossy(&child.stdout);
    let v: Vec<f64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    match v.as_slice() {
        [before, after] => Ok(after - before),
        _ => Err(format!("stage {a}..{b} printed {text:?}").into()),
    }
}

fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    if let Some(a) = arg("--one") {
        let args: Vec<String> = std::env::args().collect();
        let b = args
            .iter()
            .position(|x| x == "--one")
            .and_then(|i| args.get(i + 2))
            .ok_or("--one A B")?;
        return one(a.parse()?, b.parse()?);
    }
    let whole = measure(0, 30)?;
    let mut doc = format!(
        "Run {} on {}: `cargo run -p minions-bench --bin bench_stages -- --write`.\n\n\
SmolLM2-135M-Instruct Q4_1 (30 layers), each stage loaded in a process of its own; memory is the\n\
process's resident set after the load less before it (the weights as the CPU kernels hold them).\n\n\
| split | stage | layers | MB held | share of the whole |\n|---|---|---|---|---|\n",
        utc_now(),
        machine()
    );
    for bounds in SPLITS {
        let name = bounds
            .windows(2)
            .map(|w| (w[1] - w[0]).to_string())
            .collect::<Vec<_>>()
            .join("/");
        for (i, w) in bounds.windows(2).enumerate() {
            let mb = measure(w[0], w[1])?;
            doc.push_str(&format!(
                "| {name} | {} | {}..{} | {mb:.1} | {:.2} |\n",
                i + 1,
                w[0],
                w[1],
                mb / whole
            ));
        }
    }
    out!("{doc}");
    if flag("--write") {
        let p = write_section("bench_stages", &doc)?;
        out!("written to {}", p.display());
    }
    Ok(())
}
