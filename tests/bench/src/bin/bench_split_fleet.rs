//! Acceptance run: a language model split over worker processes, against
//! one worker. SmolLM2-135M-Instruct Q4_1 (30 layers) over the 200 chat
//! prompts of the generation benchmarks, greedy and seeded, split 15/15,
//! 7/23 and 10/10/10 (`submit --split`) over worker processes formed into
//! groups by a watchdog, on one nats-server on loopback: every record's
//! line (text, finish reason, token counts) must equal the single-worker
//! run's. The 10/10/10 jobs lose a stage halfway (`kill -9` of the middle
//! stage, then of the last): a spare takes its layers; the recovery time
//! and the records run again are printed. Each stage's resident memory
//! while it runs is printed against a worker holding the whole model.
//! Too long for the test suite; `tests/tests/llm_stages.rs` checks the
//! same on a short job.
//!
//!   cargo build --workspace --bins && target/debug/bench_split_fleet --write
//!
//! Its flags are in [`USAGE`], which `--help` prints.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use minions_tests::bench::{flag, help, machine, num, status_mb, utc_now, write_section};
use minions_tests::{Fleet, Result, chat_prompts, out};

/// What `--help` prints.
const USAGE: &str = "\
A language model split over worker processes: equality with one worker, a lost stage, memory.

Usage: bench_split_fleet [--prompts N] [--max-tokens T] [--write]
  --prompts N      chat prompts (default 200)
  --max-tokens T   tokens generated per prompt at most (default 32)
  --shard-size S   records per shard (default 50)
  --write          put the Markdown into BENCHMARKS.md between its markers
";

/// Seeded sampling, as `submit` takes it.
const SEEDED: [&str; 4] = ["--temperature", "0.8", "--seed", "4242"];

/// A job's output: each record's collected line by id.
type Lines = BTreeMap<String, String>;

/// Runs a job by name with extra `submit` flags.
type RunJob<'a> = dyn Fn(&Fleet, &str, &[&str]) -> Result<Ran> + 'a;

/// What one job gave.
struct Ran {
    lines: Lines,
    secs: f64,
    /// Most resident MB seen per worker (index into `fleet.workers`)
    /// while the job ran.
    rss: BTreeMap<usize, f64>,
}

fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let n = num("--prompts", 200)? as usize;
    let max = num("--max-tokens", 32)?;
    let shard = num("--shard-size", 50)?;
    let mut fleet = Fleet::local()?;
    fleet
        .worker_env
        .push(("RAYON_NUM_THREADS".into(), "1".into()));
    fleet.push_smollm2("smollm2")?;
    fleet.add_watchdog(&[])?;
    let input = fleet.dir.path().join("prompts.jsonl");
    let lines: Vec<String> = chat_prompts(n)
        .iter()
        .enumerate()
        .map(|(i, q)| {
            serde_json::json!({"id": format!("p{i}"), "messages": [{"role": "user", "content": q}]})
                .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n")?;
    let add = |fleet: &mut Fleet| {
        fleet.add_worker(&["--slots", "1", "--max-seqs", "32", "--checkpoint-secs", "2"])
    };
    for _ in 0..4 {
        add(&mut fleet)?;
    }
    minions_tests::bench::wait_workers(&fleet, 4)?;
    std::thread::sleep(Duration::from_secs(2));
    let idle: Vec<f64> = fleet
        .workers
        .iter()
        .filter_map(|w| status_mb(w.pid() as u32, "VmRSS:").ok())
        .collect();
    let idle_rss = idle.iter().sum::<f64>() / idle.len().max(1) as f64;
    let job = |fleet: &Fleet, name: &str, extra: &[&str]| -> Result<Ran> {
        let mut args = vec![
            "submit",
            "--model",
            "smollm2",
            "--input",
            input.to_str().ok_or("input path")?,
            "--shard-size",
        ];
        let (s, m) = (shard.to_string(), max.to_string());
        args.extend([s.as_str(), "--max-tokens", m.as_str(), "--job", name]);
        args.extend(extra);
        let watch = Watch::start(fleet);
        let started = Instant::now();
        fleet.cli(&args)?;
        let status = fleet.wait_job(name, Duration::from_secs(3600))?;
        let secs = started.elapsed().as_secs_f64();
        let rss = watch.stop();
        if status["state"] != "done" {
            return Err(format!("job {name} ended {status}").into());
        }
        Ok(Ran {
            lines: collected(fleet, name)?,
            secs,
            rss,
        })
    };

    let mut doc = format!(
        "Run {} on {}: `target/debug/bench_split_fleet --write` (dev profile, optimized).\n\n\
SmolLM2-135M-Instruct Q4_1 (30 layers), {n} chat prompts, at most {max} tokens each, shards of {shard}; \
workers of one thread each (`--max-seqs 32`) on one machine, a watchdog forming the groups, one nats-server on loopback. \
Seeded: `{}`. A record is equal when its whole collected line (text, finish reason, token counts) is. \
Job seconds are wall time, not a speed figure (`bench_split` measures speed).\n\n",
        utc_now(),
        machine(),
        SEEDED.join(" ")
    );
    // The splits on fresh workers first, so each stage's memory is its own.
    let mut runs: Vec<(String, Ran, Option<Fault>)> = Vec::new();
    for (split, name) in [("15,15", "s15"), ("7,23", "s7")] {
        for (mode, extra) in [("greedy", &[][..]), ("seeded", &SEEDED[..])] {
            let job_name = format!("{name}-{mode}");
            let args: Vec<&str> = [&["--split", split][..], extra].concat();
            let ran = job(&fleet, &job_name, &args)?;
            eprintln!("{job_name}: {:.1} s", ran.secs);
            runs.push((format!("{split} {mode}"), ran, None));
        }
    }
    for (mode, extra, killed) in [("greedy", &[][..], 1usize), ("seeded", &SEEDED[..], 2usize)] {
        let job_name = format!("s10-{mode}");
        let args: Vec<&str> = [&["--split", "10,10,10"][..], extra].concat();
        let (ran, fault) = job_with_fault(&mut fleet, &job, &job_name, &args, killed, shard, n)?;
        eprintln!("{job_name}: {:.1} s", ran.secs);
        runs.push((format!("10,10,10 {mode}"), ran, Some(fault)));
        add(&mut fleet)?;
    }
    let one_greedy = job(&fleet, "one-greedy", &[])?;
    let one_seeded = job(&fleet, "one-seeded", &SEEDED)?;
    let whole_rss = one_greedy
        .rss
        .values()
        .chain(one_seeded.rss.values())
        .fold(0.0f64, |a, &b| a.max(b));

    doc.push_str(
        "| split | sampling | records equal to one worker | job s | stage resident MB (most while it ran) | lost stage |\n|---|---|---|---|---|---|\n",
    );
    let mut unequal = 0;
    for (what, ran, fault) in &runs {
        let (split, mode) = what.split_once(' ').unwrap_or((what, ""));
        let want = if mode == "greedy" {
            &one_greedy
        } else {
            &one_seeded
        };
        let equal = want
            .lines
            .iter()
            .filter(|(id, l)| ran.lines.get(*id) == Some(l))
            .count();
        if equal != want.lines.len() || ran.lines.len() != want.lines.len() {
            unequal += 1;
        }
        let job_name = job_name_of(split, mode);
        let stages = split.split(',').count();
        let rss: Vec<String> = (0..stages)
            .map(|k| {
                fleet
                    .stage_worker(k, &job_name)
                    .and_then(|w| ran.rss.get(&w))
                    .map_or("?".into(), |mb| format!("{mb:.0}"))
            })
            .collect();
        let lost = fault.as_ref().map_or("none".into(), Fault::describe);
        doc.push_str(&format!(
            "| {split} | {mode} | {equal} of {} | {:.1} | {} | {lost} |\n",
            want.lines.len(),
            ran.secs,
            rss.join(" / ")
        ));
    }
    doc.push_str(&format!(
        "\nOne worker holding the whole model: most resident {whole_rss:.0} MB; a worker holding nothing: {idle_rss:.0} MB. \
         The single-worker jobs took {:.1} s (greedy) and {:.1} s (seeded) on {} workers.\n",
        one_greedy.secs,
        one_seeded.secs,
        fleet.workers.len()
    ));
    out!("{doc}");
    if flag("--write") {
        let p = write_section("bench_split_fleet", &doc)?;
        out!("written to {}", p.display());
    }
    if unequal > 0 {
        return Err(format!("{unequal} split job(s) differ from one worker").into());
    }
    Ok(())
}

/// The job name a table row's split and sampling were run as.
fn job_name_of(split: &str, mode: &str) -> String {
    let first = split.split(',').next().unwrap_or(split);
    format!("s{first}-{mode}")
}

/// A stage lost halfway through a job, and what it cost.
struct Fault {
    stage: usize,
    stages: usize,
    /// From the kill to the watchdog's new order, as it logs it.
    recovery_ms: String,
    /// Records the first stage ran again from their prompts.
    rerun: String,
    /// From the kill to the job's end.
    to_end: f64,
}

impl Fault {
    fn describe(&self) -> String {
        let which = if self.stage + 1 == self.stages {
            "last"
        } else {
            "middle"
        };
        format!(
            "{which} stage killed: replaced {} ms after it was seen lost; {} record(s) run again; done {:.1} s after the kill",
            self.recovery_ms, self.rerun, self.to_end
        )
    }
}

/// Runs job `name` and kills (SIGKILL) its stage `stage` once half its
/// shards are done.
fn job_with_fault(
    fleet: &mut Fleet,
    job: &RunJob<'_>,
    name: &str,
    args: &[&str],
    stage: usize,
    shard: u64,
    n: usize,
) -> Result<(Ran, Fault)> {
    let shards = (n as u64).div_ceil(shard);
    let stages = args
        .iter()
        .skip_while(|a| **a != "--split")
        .nth(1)
        .map_or(2, |s| s.split(',').count());
    let (ran, ended, at) = std::thread::scope(|s| -> Result<_> {
        let fleet_ref = &*fleet;
        let watcher = s.spawn({
            move || -> Result<Option<(Instant, usize)>> {
                let until = Instant::now() + Duration::from_secs(1800);
                while Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(200));
                    let Ok(out) = fleet_ref.cli(&["status", name, "--json"]) else {
                        continue;
                    };
                    let v: serde_json::Value = serde_json::from_str(&out)?;
                    if v["state"] == "done" {
                        return Ok(None);
                    }
                    if v["done"].as_u64().unwrap_or(0) * 2 >= shards
                        && let Some(w) = fleet_ref.stage_worker(stage, name)
                    {
                        nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(fleet_ref.workers[w].pid()),
                            nix::sys::signal::Signal::SIGKILL,
                        )?;
                        return Ok(Some((Instant::now(), w)));
                    }
                }
                Ok(None)
            }
        });
        let ran = job(fleet_ref, name, args)?;
        let ended = Instant::now();
        let at = watcher.join().map_err(|_| "the killer thread panicked")??;
        Ok((ran, ended, at))
    })?;
    let (at, w) = at.ok_or(format!(
        "job {name} ended before its stage {stage} was killed"
    ))?;
    fleet.workers[w].kill();
    let field = |line: &str, key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or("?")
            .to_owned()
    };
    let watchdog = std::fs::read_to_string(&fleet.watchdogs[0].log)?;
    let group = format!("g-{name}");
    let reformed = watchdog
        .lines()
        .find(|l| l.contains("group re-formed") && l.contains(&group))
        .ok_or(format!("job {name}: the group was not re-formed"))?;
    let lead = fleet
        .stage_worker(0, name)
        .ok_or(format!("job {name}: no leader"))?;
    let lead_log = std::fs::read_to_string(&fleet.workers[lead].log)?;
    let rerun: usize = lead_log
        .lines()
        .filter(|l| l.contains("the group's epoch ended") && l.contains(&group))
        .filter_map(|l| field(l, "in_flight=").parse::<usize>().ok())
        .sum();
    Ok((
        ran,
        Fault {
            stage,
            stages,
            recovery_ms: field(reformed, "recovery_ms="),
            rerun: rerun.to_string(),
            to_end: ended.duration_since(at).as_secs_f64(),
        },
    ))
}

/// `job`'s collected lines by id.
fn collected(fleet: &Fleet, job: &str) -> Result<Lines> {
    let out = fleet.dir.path().join(format!("{job}.out.jsonl"));
    fleet.cli(&["collect", job, "--output", &out.display().to_string()])?;
    read_lines(&out)
}

fn read_lines(path: &Path) -> Result<Lines> {
    let mut lines = Lines::new();
    for l in std::fs::read_to_string(path)?.lines() {
        let v: serde_json::Value = serde_json::from_str(l)?;
        let id = v["id"].as_str().ok_or("a line without an id")?.to_owned();
        if lines.insert(id.clone(), l.to_owned()).is_some() {
            return Err(format!("record {id} collected twice").into());
        }
    }
    Ok(lines)
}

/// Samples every worker's resident memory while a job runs.
struct Watch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<BTreeMap<usize, f64>>,
}

impl Watch {
    fn start(fleet: &Fleet) -> Self {
        let pids: Vec<(usize, u32)> = fleet
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (i, w.pid() as u32))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut most = BTreeMap::new();
                while !stop.load(Ordering::SeqCst) {
                    for &(i, pid) in &pids {
                        if let Ok(mb) = status_mb(pid, "VmRSS:") {
                            let e = most.entry(i).or_insert(0.0f64);
                            *e = e.max(mb);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                most
            }
        });
        Self { stop, thread }
    }

    fn stop(self) -> BTreeMap<usize, f64> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}
