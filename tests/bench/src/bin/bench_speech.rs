//! Speech to text in process: audio seconds transcribed per second of
//! wall time by our Whisper family, over the speech clips of
//! `deploy/speech_assets.sh` (Debian's pocketsphinx-testdata and the files
//! joined from it to over 60 s), with segment timestamps, at several window
//! batch sizes; and the encoder's share of the time. It allocates through
//! mimalloc with the worker's process settings, as the worker does. The reference engine's
//! figures on the same files come from `tests/bench/speech.sh`.
//!
//!   cargo build --release -p minions-bench --bin bench_speech
//!   source deploy/speech_assets.sh && target/release/bench_speech --model tiny.en
//!
//! Its flags are in [`USAGE`], which `--help` prints.

use std::path::Path;
use std::time::Instant;

use candle_core::{Device, Tensor};
use minions_tests::bench::{arg, help, list, machine, num};
use minions_tests::{Result, real_whisper, speech_clips};
use minions_worker::model::EnginePath;
use minions_worker::model::speech::SpeechModel;
use minions_worker::model::speech::audio::{AudioLimits, decode};
use minions_worker::model::speech::transcribe::TranscribeOptions;

// The worker's allocator, so the engine runs here as it runs there.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What `--help` prints.
const USAGE: &str = "\
Whisper in process: audio seconds per second over the speech clips.

Usage: bench_speech [--model tiny.en|base] [--batches 1,4,8] [--rounds R]
                    [--beam N] [--temperatures LIST]
  --model NAME     tiny.en (default) or base
  --batches LIST   windows per encoder batch to try (default 1,4,8)
  --rounds R       rounds per batch size, the best kept (default 2)
  --beam N         beams at temperature 0 (default 1: greedy)
  --temperatures LIST  temperatures tried in turn (default 0; several:
                   Whisper's fallback)
";

/// Every `.wav` under `dir`, sorted by path.
fn wavs(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            wavs(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "wav") {
            out.push(p);
        }
    }
    out.sort();
    Ok(())
}

fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    // The worker's process settings (thread count, how long freed memory
    // is kept): without them every encoder batch faults its memory in anew.
    minions_worker::process_env::fix_process_env();
    let name = arg("--model").unwrap_or_else(|| "tiny.en".into());
    let rounds = num("--rounds", 2)?;
    let batches: Vec<usize> = list("--batches", "1,4,8")?;
    let beam = num("--beam", 1)? as usize;
    let temperatures: Vec<f32> = list("--temperatures", "0")?;
    let model = SpeechModel::load(&real_whisper(&name)?, &Device::Cpu, EnginePath::Fast)?;
    let mut paths = Vec::new();
    wavs(&speech_clips()?, &mut paths)?;
    let mut audio = Vec::new();
    for p in &paths {
        let bytes = std::fs::read(p)?;
        audio.push(decode(&bytes, Some("wav"), &AudioLimits::default())?.samples);
    }
    let seconds: f64 = audio.iter().map(|a| a.len() as f64 / 16_000.0).sum();
    let files: Vec<&[f32]> = audio.iter().map(Vec::as_slice).collect();
    eprintln!(
        "bench_speech: {name}, {} files, {seconds:.1} s of audio, beam {beam}, temperatures {temperatures:?}, {}",
        files.len(),
        machine()
    );
    // The encoder alone, per window, at each batch size.
    let d = model.whisper().dims().clone();
    for &b in &batches {
        let mel = Tensor::zeros((b, d.n_mels, 3000), candle_core::DType::F32, &Device::Cpu)?;
        let t = Instant::now();
        model.whisper().encode(&mel)?;
        eprintln!(
            "encoder: batch {b}: {:.3} s a window",
            t.elapsed().as_secs_f64() / b as f64
        );
    }
    for &b in &batches {
        let mut best = f64::INFINITY;
        let mut windows = 0;
        for _ in 0..rounds {
            let opts = TranscribeOptions {
                language: model.specials().language("en"),
                translate: false,
                timestamps: true,
                batch: b,
                beam,
                temperatures: temperatures.clone(),
                ..TranscribeOptions::default()
            };
            let t = Instant::now();
            windows = 0;
            model.transcribe(&files, &opts, &|| false, &mut |_, r| {
                windows += r.map(|r| r.windows).unwrap_or(0);
            })?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        minions_tests::out!(
            "{name} batch {b}: {seconds:.1} s of audio in {best:.2} s = {:.1} audio s/s ({windows} windows, {:.3} s a window)",
            seconds / best,
            best / windows.max(1) as f64
        );
    }
    Ok(())
}
