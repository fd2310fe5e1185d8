//! Benchmark: a language model split over two processes, against one.
//! SmolLM2-135M-Instruct Q4_1 split 15/15: the first stage and the second
//! each in a process of its own on one thread, joined through a real
//! nats-server, with one and with two micro-batch groups in flight;
//! against the whole model in one process on two threads and on one. The
//! split efficiency is tok/s(2 stages × 1 thread) / tok/s(1 process × 2
//! threads). A link shim (this benchmark's only) delays each frame as a
//! link of the given latency and bandwidth would: none (loopback), a
//! gigabit LAN (0.3 ms, 1 Gbit/s) and Wi-Fi (3 ms, 200 Mbit/s).
//!
//!   cargo build --workspace --bins && target/debug/bench_split --write
//!
//! Its flags are in [`USAGE`], which `--help` prints.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use candle_core::Device;
use futures::StreamExt;
use minions_schemas::messages::{StagePass, StageReply};
use minions_tests::bench::{arg, flag, help, machine, utc_now, write_section};
use minions_tests::{NatsServer, Result, chat_records, greedy_cases, out, real_gguf};
use minions_worker::model::llm::gguf::GgufFile;
use minions_worker::model::llm::llama::Llama;
use minions_worker::model::llm::pipeline::{Split, StageLink, generate_split};
use minions_worker::model::llm::stage::StageServer;
use minions_worker::model::llm::stage_wire::{Outgoing, ReplyReader, StageEnd, Taken, pass_parts};
use minions_worker::model::llm::{GenControl, GenLimits, GgufGenerator};
use minions_worker::model::{EnginePath, Model, ModelError};

/// What `--help` prints.
const USAGE: &str = "\
A language model split 15/15 over two processes joined through NATS, against one process.

Usage: bench_split [--prompts N] [--tokens T] [--rounds R] [--at L] [--micro LIST] [--write]
  --prompts N   chat prompts (default 32)
  --tokens T    tokens generated per prompt (default 32)
  --rounds R    rounds, side by side (default 3)
  --at L        the first stage holds layers 0..L, the second L..30 (default 15)
  --micro LIST  micro-batch groups to measure, comma-separated (default 1,2,4)
  --write       put the Markdown into BENCHMARKS.md between its markers
";

/// The split point of the model's 30 layers (`--at`, default 15).
fn split_at() -> usize {
    arg("--at").and_then(|v| v.parse().ok()).unwrap_or(15)
}

/// The links measured: name, latency µs, Mbit/s (0: no shim).
const LINKS: [(&str, u64, u64); 3] = [
    ("loopback", 0, 0),
    ("LAN 0.3 ms, 1 Gbit/s", 300, 1000),
    ("Wi-Fi 3 ms, 200 Mbit/s", 3000, 200),
];

/// The value `k` places after flag `name`.
fn nth(name: &str, k: usize) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + k).cloned())
}

fn num(name: &str, default: usize) -> Result<usize> {
    Ok(arg(name).map(|v| v.parse()).transpose()?.unwrap_or(default))
}

/// Sends frames over a shimmed link: each is delivered once the link has
/// carried its bytes (frames queue behind each other) plus the latency.
fn shim(
    client: async_nats::Client,
    latency: Duration,
    mbit: u64,
) -> tokio::sync::mpsc::UnboundedSender<(String, Vec<Vec<u8>>)> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Vec<Vec<u8>>)>();
    tokio::spawn(async move {
        let mut free_at = tokio::time::Instant::now();
        while let Some((subject, parts)) = rx.recv().await {
            if mbit > 0 {
                let bytes: usize = parts.iter().map(Vec::len).sum();
                let carry = Duration::from_secs_f64(bytes as f64 * 8.0 / (mbit as f64 * 1e6));
                free_at = free_at.max(tokio::time::Instant::now()) + carry;
                tokio::time::sleep_until(free_at + latency).await;
            }
            for p in parts {
                let _ = client.publish(subject.clone(), p.into()).await;
            }
        }
    });
    tx
}

/// A runtime, a client, and the parts arriving on `inbox`.
fn connect(
    url: &str,
    inbox: &str,
) -> Result<(
    tokio::runtime::Runtime,
    async_nats::Client,
    mpsc::Receiver<Bytes>,
)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let client = rt.block_on(async_nats::connect(url))?;
    let mut sub = rt.block_on(client.subscribe(inbox.to_owned()))?;
    rt.block_on(client.flush())?;
    let (tx, rx) = mpsc::channel();
    rt.spawn(async move {
        while let Some(m) = sub.next().await {
            if tx.send(m.payload).is_err() {
                break;
            }
        }
    });
    Ok((rt, client, rx))
}

/// The second stage: serves passes from `in` to `out` until killed.
fn serve(url: &str, inbox: &str, outbox: &str, latency: Duration, mbit: u64) -> Result<()> {
    let mut file = GgufFile::open(&real_gguf()?)?;
    let model = Llama::load_stage(&mut file, &Device::Cpu, EnginePath::Fast, split_at()..30)?;
    let mut end = StageEnd::new(StageServer::new(model, "bench")?, 1);
    let (rt, client, parts) = connect(url, inbox)?;
    let send = {
        let _in_rt = rt.enter();
        shim(client, latency, mbit)
    };
    out!("ready");
    while let Ok(p) = parts.recv() {
        match end.take(&p)? {
            Taken::Send(Outgoing::Next(list) | Outgoing::First(list)) => {
                send.send((outbox.to_owned(), list))?;
            }
            Taken::Partial | Taken::Dropped(_) => {}
        }
    }
    Ok(())
}

/// The first stage's link in this benchmark.
struct BenchLink {
    send: tokio::sync::mpsc::UnboundedSender<(String, Vec<Vec<u8>>)>,
    next: String,
    replies: mpsc::Receiver<Bytes>,
    reader: ReplyReader,
}

impl StageLink for BenchLink {
    fn send(&mut self, pass: StagePass) -> std::result::Result<(), ModelError> {
        let parts = pass_parts(&pass)?;
        self.send
            .send((self.next.clone(), parts))
            .map_err(|e| ModelError::StageLost(e.to_string()))
    }

    fn recv(&mut self, _stop: &AtomicBool) -> std::result::Result<StageReply, ModelError> {
        loop {
            let p = self
                .replies
                .recv_timeout(Duration::from_secs(120))
                .map_err(|e| ModelError::StageLost(e.to_string()))?;
            if let Some(r) = self.reader.take(&p)? {
                return Ok(r);
            }
        }
    }
}

/// The records: the first `n` chat cases, `tokens` greedy tokens each.
fn records(n: usize, tokens: u32) -> Result<Vec<minions_schemas::messages::GenerationRecord>> {
    let cases = greedy_cases()?;
    let picked: Vec<serde_json::Value> = cases.iter().cycle().take(n).cloned().collect();
    chat_records(&picked, tokens)
}

/// Prints generated tokens and seconds for the records: the whole model
/// here, or (with `lead`) the first stage driving the second.
fn run(n: usize, tokens: u32, lead: Option<(&str, usize, Duration, u64)>) -> Result<()> {
    let recs = records(n, tokens)?;
    let indexed: Vec<_> = recs.iter().enumerate().collect();
    let limits = GenLimits {
        max_seqs: n,
        ..GenLimits::default()
    };
    let mut generated = 0u64;
    let started;
    match lead {
        None => {
            let g = GgufGenerator::load(&real_gguf()?, &Device::Cpu)?;
            started = Instant::now();
            g.generate(&indexed, limits, &GenControl::default(), &mut |_, r| {
                generated += u64::from(r.completion_tokens)
            })?;
        }
        Some((url, micro, latency, mbit)) => {
            let g = GgufGenerator::load_stage(
                &real_gguf()?,
                &Device::Cpu,
                EnginePath::Fast,
                0..split_at(),
            )?;
            let (rt, client, replies) = connect(url, "bench.back")?;
            let send = {
                let _in_rt = rt.enter();
                shim(client, latency, mbit)
            };
            let mut link = BenchLink {
                send,
                next: "bench.in".into(),
                replies,
                reader: ReplyReader::default(),
            };
            let mut split = Split::new("bench", 1, micro, 30 - split_at());
            let work = g.prepare_all(&indexed, &mut |_, _| {})?;
            started = Instant::now();
            generate_split(
                g.model(),
                g.tokenizer(),
                work,
                limits,
                &mut split,
                &GenControl::default(),
                &mut link,
                &mut |_, r| generated += u64::from(r.completion_tokens),
            )?;
        }
    }
    out!("{generated} {:.4}", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs this binary with `args` on `threads` threads; its tokens/s.
fn child(args: &[String], threads: usize) -> Result<f64> {
    let o = Command::new(std::env::current_exe()?)
        .args(args)
        .env("RAYON_NUM_THREADS", threads.to_string())
        .output()?;
    if !o.status.success() {
        return Err(format!("{args:?}: {}", String::from_utf8_lossy(&o.stderr)).into());
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let v: Vec<f64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    match v.as_slice() {
        [tokens, secs] if *secs > 0.0 => Ok(tokens / secs),
        _ => Err(format!("{args:?} printed {text:?}").into()),
    }
}

/// Starts the second stage in a child on one thread; returns it once it
/// listens.
fn second_stage(url: &str, latency_us: u64, mbit: u64) -> Result<Child> {
    let mut c = Command::new(std::env::current_exe()?)
        .args([
            "--at",
            &split_at().to_string(),
            "--serve",
            url,
            &latency_us.to_string(),
            &mbit.to_string(),
        ])
        .env("RAYON_NUM_THREADS", "1")
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = c.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = c.kill();
        return Err(format!("the second stage said {line:?}").into());
    }
    Ok(c)
}

/// The build profile this binary came from (its folder under `target/`).
fn profile() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "release".into())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let n = num("--prompts", 32)?;
    let tokens = num("--tokens", 32)? as u32;
    if flag("--serve") {
        let url = nth("--serve", 1).ok_or("--serve URL LATENCY_US MBIT")?;
        let lat: u64 = nth("--serve", 2).ok_or("latency")?.parse()?;
        let mbit: u64 = nth("--serve", 3).ok_or("mbit")?.parse()?;
        return serve(
            &url,
            "bench.in",
            "bench.back",
            Duration::from_micros(lat),
            mbit,
        );
    }
    if flag("--whole") {
        return run(n, tokens, None);
    }
    if flag("--lead") {
        let url = nth("--lead", 1).ok_or("--lead URL MICRO LATENCY_US MBIT")?;
        let micro: usize = nth("--lead", 2).ok_or("micro")?.parse()?;
        let lat: u64 = nth("--lead", 3).ok_or("latency")?.parse()?;
        let mbit: u64 = nth("--lead", 4).ok_or("mbit")?.parse()?;
        return run(
            n,
            tokens,
            Some((&url, micro, Duration::from_micros(lat), mbit)),
        );
    }
    let rounds = num("--rounds", 3)?;
    let micros: Vec<usize> = arg("--micro")
        .unwrap_or_else(|| "1,2,4".into())
        .split(',')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    let nats = NatsServer::start()?;
    let url = nats.url();
    let size = [
        "--prompts".to_owned(),
        n.to_string(),
        "--tokens".to_owned(),
        tokens.to_string(),
        "--at".to_owned(),
        split_at().to_string(),
    ];
    let whole: Vec<String> = [vec!["--whole".to_owned()], size.to_vec()].concat();
    // (name, samples)
    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    let mut add = |name: String, v: f64| match rows.iter_mut().find(|r| r.0 == name) {
        Some(r) => r.1.push(v),
        None => rows.push((name, vec![v])),
    };
    for round in 1..=rounds {
        add("1 process × 2 threads".into(), child(&whole, 2)?);
        add("1 process × 1 thread".into(), child(&whole, 1)?);
        for (link, lat, mbit) in LINKS {
            for &micro in &micros {
                let mut stage = second_stage(&url, lat, mbit)?;
                let args: Vec<String> = [
                    vec![
                        "--lead".to_owned(),
                        url.clone(),
                        micro.to_string(),
                        lat.to_string(),
                        mbit.to_string(),
                    ],
                    size.to_vec(),
                ]
                .concat();
                let r = child(&args, 1);
                let _ = stage.kill();
                let _ = stage.wait();
                add(
                    format!("2 stages × 1 thread, {micro} micro-batch group(s), {link}"),
                    r?,
                );
            }
        }
        eprintln!("round {round} of {rounds} done");
    }
    let two = rows
        .iter()
        .find(|r| r.0.starts_with("1 process × 2"))
        .map(|r| median(&mut r.1.clone()))
        .unwrap_or(1.0);
    let mut doc = format!(
        "Run {} on {}: `target/{profile}/bench_split --at {at} --rounds {rounds} --write` ({rounds} rounds, side by side).\n\n\
SmolLM2-135M-Instruct Q4_1, {n} chat prompts, {tokens} greedy tokens each, all in one batch. Split {at}/{rest}:\n\
each stage a process of its own on one thread (`RAYON_NUM_THREADS=1`), hidden states in f32 through a\n\
local nats-server; the link shim delays each frame by its bytes at the link's rate plus its latency.\n\
Efficiency: against one process on two threads. Median tokens/s; every round in brackets.\n\n\
| run | generated tokens/s | efficiency | rounds |\n|---|---|---|---|\n",
        utc_now(),
        machine(),
        at = split_at(),
        rest = 30 - split_at(),
        profile = profile(),
    );
    for (name, v) in &rows {
        let m = median(&mut v.clone());
        let each: Vec<String> = v.iter().map(|x| format!("{x:.1}")).collect();
        doc.push_str(&format!(
            "| {name} | {m:.1} | {:.2} | {} |\n",
            m / two,
            each.join(", ")
        ));
    }
    out!("{doc}");
    if flag("--write") {
        let p = write_section("bench_split", &doc)?;
        out!("written to {}", p.display());
    }
    Ok(())
}
