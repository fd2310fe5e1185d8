//! Benchmark: what Minions costs next to the work it carries, each figure a
//! ratio against the physical limit measured side by side in the same run.
//!
//! 1. Overhead: sentences/s of a job through Minions (1 worker, the real
//!    all-MiniLM-L6-v2) over the same model code, batch size and texts
//!    called in-process, for shard sizes 64, 256 and 1024.
//! 2. Dispatch: shards/s through submit → worker → ack with a near no-op
//!    model (one 8-wide layer, one short text per shard) for 1, 2 and 4
//!    workers, over raw JetStream publish + pull + ack with async-nats,
//!    with the store on disk and in a RAM-backed folder, beside the store's
//!    own create-only put rate.
//! 3. Latency: submit → first shard running (warm workers); kill -9 → the
//!    shard running elsewhere; owner active → the shard running elsewhere.
//! 4. Scale: 1,000 simulated workers in this process heartbeating and
//!    pulling no-op shards against one nats-server and one watchdog.
//! 5. Submission: `minions submit` of a 1,000,000-record input: records/s
//!    and peak memory, beside a 100,000-record input.
//!
//!   source deploy/tools.sh --test   # nats-server and the real model
//!   cargo build --release --workspace --bins
//!   target/release/bench_fleet --write
//!
//! Starts its own nats-server and store (a temporary folder). Prints
//! Markdown; `--write` also puts it into BENCHMARKS.md between markers.
//! `--only overhead,dispatch,latency,scale,submit` runs some sections.

use std::future::IntoFuture as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use minions_schemas::messages::{
    EventKind, Heartbeat, InFlight, ModelFamily, Precision, ShardEvent, ShardTask,
};
use minions_schemas::time::now_ms;
use minions_schemas::{
    JobId, ModelHash, SCHEMA_VERSION, WorkerId, decode, encode, limits, streams, subjects,
};
use minions_tests::bench::{
    JobWatch, NOOP, arg, command_line, cpu_secs, flag, help, machine, num, status_mb, utc_now,
    write_section, write_short,
};
use minions_tests::out;
use minions_tests::{Fleet, NatsServer, Result, real_model_dir, write_corpus};
use minions_worker::model::Batching;

// ---------------------------------------------------------------- helpers

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Adds a publish's confirmation to `acks`, first waiting for one when 256
/// are in flight (publishes pipelined, as `minions submit` does).
async fn in_window<F, T, E>(
    acks: &mut futures::stream::FuturesUnordered<F>,
    ack: F,
) -> std::result::Result<(), E>
where
    F: std::future::Future<Output = std::result::Result<T, E>>,
{
    if acks.len() >= 256 {
        acks.next().await.transpose()?;
    }
    acks.push(ack);
    Ok(())
}

/// Submits in this process through the `minions` library (no process start
/// in the figure).
async fn submit_here(fleet: &Fleet, model: &str, input: &Path, job: &str) -> Result<()> {
    use clap::Parser as _;
    let cli = minions::cli::Cli::try_parse_from([
        "minions",
        "--nats",
        &fleet.nats.url(),
        "--store",
        &fleet.store_url,
        "submit",
        "--model",
        model,
        "--input",
        &input.display().to_string(),
        "--job",
        job,
        "--shard-size",
        "1",
    ])?;
    let minions::cli::Command::Submit(args) = cli.command else {
        return Err("not a submit".into());
    };
    minions::commands::submit::run(&cli.endpoints, *args).await?;
    Ok(())
}

// ---------------------------------------------------------------- 1. overhead

async fn overhead(texts_n: usize) -> Result<String> {
    let model_dir = real_model_dir()?;
    let mut fleet = Fleet::local()?;
    let client = fleet.nats.client().await?;
    fleet.cli(&[
        "model",
        "push",
        &model_dir.display().to_string(),
        "--name",
        "minilm",
    ])?;
    let input = fleet.dir.path().join("texts.jsonl");
    let texts = write_corpus(&input, texts_n)?;
    let warm_input = fleet.dir.path().join("warm.jsonl");
    write_corpus(&warm_input, 64)?;
    fleet.add_worker(&["--max-batch", "32", "--slots", "2"])?;
    // Warm the worker (model loaded and cached) and the in-process model.
    let mut w = JobWatch::new(&client, "warm").await?;
    fleet.submit("minilm", &warm_input, 64, "warm")?;
    w.all_done(1, Duration::from_secs(600)).await?;
    let model = minions_worker::model::BertEmbedder::load(
        &model_dir,
        &candle_core::Device::Cpu,
        Precision::F32,
    )?;
    model.embed(&texts[..64], Batching::texts(32))?;

    let mut rows = Vec::new();
    for shard_size in [64u32, 256, 1024] {
        let shards = texts_n.div_ceil(shard_size as usize);
        let job = format!("overhead{shard_size}");
        let t = Instant::now();
        model.embed(&texts, Batching::texts(32))?;
        let before = texts_n as f64 / t.elapsed().as_secs_f64();
        let mut w = JobWatch::new(&client, &job).await?;
        let t0 = now_ms();
        fleet.submit("minilm", &input, shard_size, &job)?;
        let t1 = w.all_done(shards, Duration::from_secs(3600)).await?;
        let through = texts_n as f64 / ((t1 - t0) as f64 / 1000.0);
        let t = Instant::now();
        model.embed(&texts, Batching::texts(32))?;
        let after = texts_n as f64 / t.elapsed().as_secs_f64();
        let here = (before + after) / 2.0;
        out!("overhead: shard size {shard_size}: Minions {through:.1}/s, in-process {here:.1}/s");
        rows.push(format!(
            "| {shard_size} | {shards} | {through:.1} | {here:.1} ({before:.1}, {after:.1}) | **{:.3}** |",
            through / here
        ));
    }
    Ok(format!(
        "{texts_n} texts, batch 32, 1 worker (2 slots), all-MiniLM-L6-v2 (f32, CPU). \
         Minions: from `minions submit` starting to the last shard's `done` event. \
         In-process: `BertEmbedder::embed` on the same texts, same batch size, run right before and right after \
         the job; the ratio is against the mean of the two.\n\n\
         | shard size | shards | through Minions (texts/s) | in-process (texts/s): mean (before, after) | ratio |\n\
         |---:|---:|---:|---:|---:|\n{}\n",
        rows.join("\n")
    ))
}

// ---------------------------------------------------------------- 2. dispatch

/// Raw JetStream: `n` messages published pipelined into a work-queue stream,
/// pulled one at a time by `pullers` concurrent pullers and acked with the
/// server's confirmation, as workers do. Returns messages/s.
async fn raw_jetstream(nats: &NatsServer, n: usize, pullers: usize, round: usize) -> Result<f64> {
    use async_nats::jetstream::{self, consumer, stream};
    let client = nats.client().await?;
    let js = jetstream::new(client.clone());
    let name = format!("RAW{round}");
    let subject = format!("raw{round}.>");
    let s = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await?;
    let c: consumer::PullConsumer = s
        .create_consumer(consumer::pull::Config {
            durable_name: Some("raw".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            max_ack_pending: 20_000,
            ..Default::default()
        })
        .await?;
    let acked = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let publisher = {
        let js = js.clone();
        tokio::spawn(async move {
            let mut acks = futures::stream::FuturesUnordered::new();
            for i in 0..n {
                let msg_id = format!("raw/{i}");
                let mut h = async_nats::HeaderMap::new();
                h.insert(async_nats::header::NATS_MESSAGE_ID, msg_id.as_str());
                let ack = js
                    .publish_with_headers(format!("raw{round}.{i}"), h, vec![0u8; 200].into())
                    .await?
                    .into_future();
                in_window(&mut acks, ack).await?;
            }
            while acks.next().await.transpose()?.is_some() {}
            Ok::<_, async_nats::Error>(())
        })
    };
    let mut tasks = Vec::new();
    for _ in 0..pullers {
        let c = c.clone();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            while acked.load(Ordering::Relaxed) < n as u64 {
                let mut batch = c
                    .batch()
                    .max_messages(1)
                    .expires(Duration::from_millis(500))
                    .messages()
                    .await?;
                while let Some(m) = batch.next().await {
                    let m = m?;
                    m.double_ack().await?;
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, async_nats::Error>(())
        }));
    }
    publisher.await??;
    for t in tasks {
        t.await??;
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    js.delete_stream(&name).await?;
    Ok(rate)
}

/// Where a dispatch run keeps its local-folder store.
#[derive(Clone, Copy, PartialEq)]
enum StoreOn {
    /// The scratch folder's file system (what `minions dev` uses).
    Disk,
    /// A RAM-backed folder (`/dev/shm`), to tell the file system's cost
    /// from the dispatch path's.
    Memory,
}

impl StoreOn {
    fn name(self) -> &'static str {
        match self {
            StoreOn::Disk => "disk",
            StoreOn::Memory => "memory",
        }
    }
}

/// Create-only puts/s of 300-byte objects into `store_url`, `concurrency`
/// at a time: what the store alone allows per shard output.
async fn store_puts(store_url: &str, n: usize, concurrency: usize) -> Result<f64> {
    use object_store::{PutMode, PutOptions, path::Path as StorePath};
    let store = minions_endpoints::store::open(store_url)?;
    let t = Instant::now();
    let mut puts = futures::stream::iter(0..n)
        .map(|i| {
            let store = store.clone();
            async move {
                let opts = PutOptions {
                    mode: PutMode::Create,
                    ..Default::default()
                };
                let key = StorePath::from(format!("bench-puts/{concurrency}/{i:08}.bin"));
                store.put_opts(&key, vec![7u8; 300].into(), opts).await
            }
        })
        .buffer_unordered(concurrency);
    while let Some(r) = puts.next().await {
        r?;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

async fn dispatch(shards: usize) -> Result<String> {
    let mut rows = Vec::new();
    let memory = Path::new("/dev/shm");
    let stores: &[StoreOn] = if memory.is_dir() {
        &[StoreOn::Disk, StoreOn::Memory]
    } else {
        &[StoreOn::Disk]
    };
    for &on in stores {
        let mut fleet = Fleet::local()?;
        // Kept until the fleet is done with it.
        let _ram = match on {
            StoreOn::Disk => None,
            StoreOn::Memory => {
                let d = tempfile::Builder::new()
                    .prefix("minions-bench-store-")
                    .tempdir_in(memory)?;
                fleet.store_url = format!("file://{}", d.path().display());
                Some(d)
            }
        };
        let client = fleet.nats.client().await?;
        fleet.push_model("noop", NOOP)?;
        let input = fleet.dir.path().join("short.jsonl");
        write_short(&input, shards)?;
        let warm = fleet.dir.path().join("warm.jsonl");
        write_short(&warm, 4)?;
        let mut have = 0;
        for (round, workers) in [1usize, 2, 4].into_iter().enumerate() {
            while have < workers {
                fleet.add_worker(&[])?;
                have += 1;
            }
            let job = format!("warm{workers}");
            let mut w = JobWatch::new(&client, &job).await?;
            fleet.submit("noop", &warm, 1, &job)?;
            w.all_done(4, Duration::from_secs(120)).await?;
            let job = format!("dispatch{workers}");
            let mut w = JobWatch::new(&client, &job).await?;
            let t0 = now_ms();
            let s = Instant::now();
            fleet.submit("noop", &input, 1, &job)?;
            let submitted = s.elapsed().as_secs_f64();
            let t1 = w.all_done(shards, Duration::from_secs(1200)).await?;
            let rate = shards as f64 / ((t1 - t0) as f64 / 1000.0);
            let raw = raw_jetstream(&fleet.nats, shards, workers * 2, round).await?;
            let puts = store_puts(&fleet.store_url, shards, workers * 2).await?;
            out!(
                "dispatch ({} store): {workers} workers: {rate:.0} shards/s, raw JetStream {raw:.0}/s, store {puts:.0} puts/s",
                on.name()
            );
            rows.push(format!(
                "| {} | {workers} | {} | {rate:.0} | {submitted:.2} | {raw:.0} | **{:.3}** | {puts:.0} |",
                on.name(),
                workers * 2,
                rate / raw
            ));
        }
    }
    Ok(format!(
        "{shards} shards of one short text each, a near no-op model (BERT, 1 layer 8 wide, \
         a forward pass takes microseconds), 2 slots per worker. Minions: from `minions submit` starting \
         (it uploads every shard's input and publishes it) to the last `done` event; each shard \
         is pulled, its input read from the store, run, its output written create-only, \
         `started` and `done` events stored, and acked with confirmation. Raw JetStream: the \
         same number of 200-byte messages published pipelined with message ids into a \
         work-queue stream, pulled one at a time by as many pullers as there are slots and \
         acked with confirmation (async-nats, in this process), measured right after on the \
         same server. Store alone: as many create-only puts of 300-byte objects into the \
         same store, as many at a time as there are slots (object_store, in this process), \
         measured right after that. The local-folder store runs once on the scratch folder's \
         disk and once in a RAM-backed folder (`/dev/shm`), each with its own nats-server \
         (whose own store stays on disk).\n\n\
         | store | workers | slots | Minions (shards/s) | submit took (s) | raw JetStream (msgs/s) | ratio | store alone (puts/s) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n{}\n",
        rows.join("\n")
    ))
}

// ---------------------------------------------------------------- 3. latency

/// Starts a worker with `extra` flags and returns its name prefix (`wN-`).
fn start_worker(fleet: &mut Fleet, extra: &[&str]) -> Result<(usize, String)> {
    fleet.add_worker(extra)?;
    let i = fleet.workers.len() - 1;
    let name = fleet.workers[i]
        .log
        .file_stem()
        .and_then(|s| s.to_str())
        .map(|s| s.replace("worker", "w"))
        .ok_or("worker without a log name")?;
    Ok((i, format!("{name}-")))
}

/// One failover: worker A (with `a_flags`) runs the only shard of a slow
/// job, worker B joins, `act` hits A; returns ms from the act to the shard
/// starting on B (from the events' clocks).
async fn failover(
    fleet: &mut Fleet,
    client: &async_nats::Client,
    input: &Path,
    job: &str,
    a_flags: &[&str],
    act: impl FnOnce(&mut Fleet, usize) -> Result<()>,
) -> Result<f64> {
    let (a, a_name) = start_worker(fleet, a_flags)?;
    let mut w = JobWatch::new(client, job).await?;
    fleet.submit("slow", input, 500, job)?;
    w.started(0, Duration::from_secs(120), |x| x.starts_with(&a_name))
        .await?;
    let (b, b_name) = start_worker(fleet, &["--slots", "1"])?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = now_ms();
    act(fleet, a)?;
    let (_, at) = w
        .started(0, Duration::from_secs(60), |x| x.starts_with(&b_name))
        .await?;
    fleet.cli(&["cancel", job])?;
    fleet.workers[a].kill();
    fleet.workers[b].kill();
    Ok(at.saturating_sub(t0) as f64)
}

async fn latency(repeats: usize, failovers: usize) -> Result<String> {
    let mut fleet = Fleet::local()?;
    let client = fleet.nats.client().await?;
    fleet.push_model("noop", NOOP)?;
    fleet.push_slow_model()?;
    fleet.add_watchdog(&[])?;
    let one = fleet.dir.path().join("one.jsonl");
    write_short(&one, 1)?;
    let four = fleet.dir.path().join("four.jsonl");
    write_short(&four, 4)?;
    let (w1, _) = start_worker(&mut fleet, &[])?;
    let (w2, _) = start_worker(&mut fleet, &[])?;
    let mut w = JobWatch::new(&client, "warm").await?;
    fleet.submit("noop", &four, 1, "warm")?;
    w.all_done(4, Duration::from_secs(120)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (mut here, mut cli, mut call, mut after) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..repeats {
        let job = format!("lat{i}");
        let mut w = JobWatch::new(&client, &job).await?;
        let t0 = now_ms();
        submit_here(&fleet, "noop", &one, &job).await?;
        let returned = now_ms();
        let (_, at) = w.started(0, Duration::from_secs(30), |_| true).await?;
        here.push(at.saturating_sub(t0) as f64);
        call.push(returned.saturating_sub(t0) as f64);
        after.push(at.saturating_sub(returned) as f64);
        w.all_done(1, Duration::from_secs(30)).await?;
        let job = format!("latcli{i}");
        let mut w = JobWatch::new(&client, &job).await?;
        let t0 = now_ms();
        fleet.submit("noop", &one, 1, &job)?;
        let (_, at) = w.started(0, Duration::from_secs(30), |_| true).await?;
        cli.push(at.saturating_sub(t0) as f64);
        w.all_done(1, Duration::from_secs(30)).await?;
    }
    fleet.workers[w1].kill();
    fleet.workers[w2].kill();
    let (here, cli, call, after) = (sorted(here), sorted(cli), sorted(call), sorted(after));
    out!(
        "latency: the submit call took p50 {:.0} ms; its return -> running p50 {:.0} ms",
        percentile(&call, 0.5),
        percentile(&after, 0.5)
    );
    out!(
        "latency: submit -> running p50 {:.0} ms (in-process submit), {:.0} ms (minions submit)",
        percentile(&here, 0.5),
        percentile(&cli, 0.5)
    );

    let input = fleet.dir.path().join("slow.jsonl");
    write_corpus(&input, 500)?;
    let mut kills = Vec::new();
    for i in 0..failovers {
        let ms = failover(
            &mut fleet,
            &client,
            &input,
            &format!("kill{i}"),
            &["--slots", "1", "--ack-wait-secs", "60"],
            |f, a| f.workers[a].signal(nix::sys::signal::Signal::SIGKILL),
        )
        .await?;
        out!("latency: kill -9 -> running elsewhere {ms:.0} ms");
        kills.push(ms);
    }
    let signal = fleet.dir.path().join("owner");
    let policy = fleet.dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "signals = [\"file:{}\"]\nmin_input_idle_secs = 60\nresume_after_secs = 3\nsample_every_ms = 100\n",
            signal.display()
        ),
    )?;
    let mut owners = Vec::new();
    for i in 0..failovers {
        std::fs::write(&signal, "idle\n")?;
        let sig = signal.clone();
        let ms = failover(
            &mut fleet,
            &client,
            &input,
            &format!("owner{i}"),
            &["--slots", "1", "--policy", &policy.display().to_string()],
            move |_, _| Ok(std::fs::write(&sig, "active\n")?),
        )
        .await?;
        out!("latency: owner active -> running elsewhere {ms:.0} ms");
        owners.push(ms);
    }
    let (kills, owners) = (sorted(kills), sorted(owners));
    let row = |what: &str, v: &[f64], target: &str| {
        format!(
            "| {what} | {} | {:.0} | {:.0} | {:.0} | {target} |",
            v.len(),
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().copied().unwrap_or(f64::NAN)
        )
    };
    Ok(format!(
        "Warm workers (model cached, a pull waiting), 1 s heartbeats, the watchdog declaring a \
         worker dead after 3 missed beats, ack wait 60 s. Times are from the events' clocks \
         (same machine): from the submit call, the `kill -9` or the owner signal turning \
         active, to the shard's `started` event on a worker.\n\n\
         | what | runs | p50 ms | p99 ms | max ms | target |\n|---|---:|---:|---:|---:|---|\n{}\n{}\n{}\n{}\n",
        row(
            "submit → running (submit called in-process)",
            &here,
            "p50 ≤ 20 ms"
        ),
        row("submit → running (`minions submit` process)", &cli, ""),
        row("kill -9 → running elsewhere", &kills, "≤ 4000 ms"),
        row("owner active → running elsewhere", &owners, "≤ 1000 ms"),
    ))
}

// ---------------------------------------------------------------- 4. scale

fn task(job: &JobId, shard: u32) -> Result<ShardTask> {
    Ok(ShardTask {
        v: SCHEMA_VERSION,
        job: job.clone(),
        shard,
        shards: u32::MAX,
        rows: 1,
        first_row: u64::from(shard),
        model_hash: ModelHash::new("b".repeat(64))?,
        family: ModelFamily::BertEmbedding,
        max_batch: 0,
        precision: Precision::F32,
        check: 0,
        avoid: Vec::new(),
    })
}

fn event(job: &JobId, shard: u32, worker: &WorkerId, kind: EventKind) -> ShardEvent {
    ShardEvent {
        energy: None,
        v: SCHEMA_VERSION,
        job: job.clone(),
        shard,
        worker: worker.clone(),
        host: "sim".into(),
        attempt: 1,
        at_ms: now_ms(),
        kind,
    }
}

/// One simulated worker: pull a shard, store `started`, store `done`, ack
/// with confirmation; its heartbeat task reads what it holds from `holding`.
async fn sim_worker(
    js: async_nats::jetstream::Context,
    consumer: async_nats::jetstream::consumer::PullConsumer,
    id: WorkerId,
    holding: Arc<std::sync::Mutex<Option<InFlight>>>,
    acked: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    while !stop.load(Ordering::Relaxed) {
        let mut batch = consumer
            .batch()
            .max_messages(1)
            .expires(Duration::from_secs(2))
            .messages()
            .await?;
        while let Some(m) = batch.next().await {
            let m = m?;
            let t: ShardTask = decode("shard task", &m.payload, limits::MAX_TASK_BYTES)?;
            if let Ok(mut h) = holding.lock() {
                *h = Some(InFlight {
                    job: t.job.clone(),
                    shard: t.shard,
                    reply: m.reply.as_ref().map(|r| r.to_string()).unwrap_or_default(),
                    started_ms: now_ms(),
                });
            }
            let started = event(&t.job, t.shard, &id, EventKind::Started);
            js.publish(
                subjects::event(&t.job, t.shard, &id),
                encode("shard event", &started)?.into(),
            )
            .await?
            .await?;
            let done = event(
                &t.job,
                t.shard,
                &id,
                EventKind::Done {
                    rows: 1,
                    output_bytes: 64,
                    duration_ms: 1,
                    compute_ms: 0,
                    already_done: false,
                    sha256: "0".repeat(64),
                    tokens: 0,
                    audio_ms: 0,
                    made_by: None,
                },
            );
            js.publish(
                subjects::event(&t.job, t.shard, &id),
                encode("shard event", &done)?.into(),
            )
            .await?
            .await?;
            m.double_ack().await?;
            if let Ok(mut h) = holding.lock() {
                *h = None;
            }
            acked.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

async fn scale(n: usize, secs: u64) -> Result<String> {
    let mut fleet = Fleet::local()?;
    // The simulated workers write no outputs: their done events are not
    // checked.
    fleet.add_watchdog(&["--unchecked-results"])?;
    let client = fleet.nats.client().await?;
    let js = async_nats::jetstream::new(client.clone());
    let settings =
        minions_endpoints::streams::ensure(&js, &streams::WorkSettings::default()).await?;
    let job = JobId::new("scale")?;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let published = Arc::new(AtomicU64::new(0));
    // Keep 10,000 shards queued ahead of the fleet.
    let feeder = {
        let (js, job, stop, acked, published) = (
            js.clone(),
            job.clone(),
            stop.clone(),
            acked.clone(),
            published.clone(),
        );
        tokio::spawn(async move {
            let mut acks = futures::stream::FuturesUnordered::new();
            while !stop.load(Ordering::Relaxed) {
                let p = published.load(Ordering::Relaxed);
                if p.saturating_sub(acked.load(Ordering::Relaxed)) > 10_000 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let s = u32::try_from(p)?;
                let ack = js
                    .publish(
                        subjects::work(&job, s),
                        encode("shard task", &task(&job, s)?)?.into(),
                    )
                    .await?
                    .into_future();
                published.fetch_add(1, Ordering::Relaxed);
                in_window(&mut acks, ack).await?;
            }
            while acks.next().await.transpose()?.is_some() {}
            Ok::<_, minions_tests::BoxError>(())
        })
    };
    let ids: Vec<WorkerId> = (0..n)
        .map(|i| WorkerId::new(format!("sim-{i:05}")))
        .collect::<std::result::Result<_, _>>()?;
    let holdings: Vec<_> = (0..n)
        .map(|_| Arc::new(std::sync::Mutex::new(None)))
        .collect();
    // Dashboards and the watchdog's job view learn of the job: its spec in
    // the store, then the `submitted` event.
    let key = fleet
        .dir
        .path()
        .join("store")
        .join(minions_schemas::keys::job_spec(&job));
    std::fs::create_dir_all(key.parent().ok_or("no parent")?)?;
    let spec = minions_schemas::messages::JobSpec {
        submitter: String::new(),
        verify_ppm: None,
        layers: None,
        stage_split: Vec::new(),
        v: SCHEMA_VERSION,
        job: job.clone(),
        model_name: minions_schemas::ModelName::new("noop")?,
        model_hash: ModelHash::new("b".repeat(64))?,
        family: ModelFamily::BertEmbedding,
        input: minions_schemas::messages::InputDescription {
            source: "simulated".into(),
            sha256: String::new(),
            bytes: 0,
            text_field: "text".into(),
            id_field: None,
        },
        shard_size: 1,
        max_batch: 0,
        precision: Precision::F32,
        shards: 1_000_000,
        records: 1_000_000,
        skipped: 0,
        created_ms: now_ms(),
        team: minions_schemas::messages::DEFAULT_TEAM.to_owned(),
        priority: Default::default(),
        preemptible: false,
        needs: Default::default(),
    };
    std::fs::write(&key, encode("job spec", &spec)?)?;
    minions_endpoints::queue::ensure_job_consumer(&js, &settings, &spec).await?;
    let submitted = event(
        &job,
        0,
        &WorkerId::new("cli")?,
        EventKind::Submitted { shards: 1_000_000 },
    );
    js.publish(
        subjects::event(&job, 0, &submitted.worker),
        encode("shard event", &submitted)?.into(),
    )
    .await?
    .await?;
    // Workers share 20 connections (50 each); heartbeats have their own.
    let mut conns = Vec::new();
    for _ in 0..20 {
        let c = fleet.nats.client().await?;
        let cjs = async_nats::jetstream::new(c);
        let cons: async_nats::jetstream::consumer::PullConsumer = cjs
            .get_stream(streams::WORK_STREAM)
            .await?
            .get_consumer(&minions_schemas::scheduling::job_consumer(&job))
            .await?;
        conns.push((cjs, cons));
    }
    let mut tasks = Vec::new();
    for (i, (id, holding)) in ids.iter().zip(&holdings).enumerate() {
        let (js, consumer) = &conns[i % conns.len()];
        tasks.push(tokio::spawn(sim_worker(
            js.clone(),
            consumer.clone(),
            id.clone(),
            holding.clone(),
            acked.clone(),
            stop.clone(),
        )));
    }
    // Heartbeats: each worker once a second, spread over the second.
    let beat_client = fleet.nats.client().await?;
    let hb_sent = Arc::new(AtomicU64::new(0));
    let beats = {
        let (client, stop, ids, holdings, sent) = (
            beat_client,
            stop.clone(),
            ids.clone(),
            holdings.clone(),
            hb_sent.clone(),
        );
        tokio::spawn(async move {
            let started_ms = now_ms();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut t = 0usize;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for (i, id) in ids.iter().enumerate() {
                    if i % 10 != t % 10 {
                        continue;
                    }
                    let held = holdings[i].lock().ok().and_then(|h| h.clone());
                    let hb = Heartbeat {
                        power: None,
                        chip: String::new(),
                        lend_mb: 0,
                        build: String::new(),
                        kernel: String::new(),
                        stage: None,
                        v: SCHEMA_VERSION,
                        worker: id.clone(),
                        host: format!("sim-{i:05}"),
                        device: "metal:0".into(),
                        slots: 1,
                        holds: 0,
                        draining: false,
                        leaving: false,
                        owner: "available".into(),
                        mem_total_mb: 32_768,
                        mem_avail_mb: 20_000,
                        mem_budget_mb: 16_384,
                        in_flight: held.into_iter().collect(),
                        done: 0,
                        failed: 0,
                        interval_ms: 1000,
                        started_ms,
                        at_ms: now_ms(),
                    };
                    client
                        .publish(subjects::heartbeat(id), encode("heartbeat", &hb)?.into())
                        .await?;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                t += 1;
            }
            Ok::<_, minions_tests::BoxError>(())
        })
    };
    let watchdog = fleet.watchdogs[0].pid() as u32;
    let nats = fleet.nats.proc.pid() as u32;
    let me = std::process::id();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (a0, w0, n0, m0, t0) = (
        acked.load(Ordering::Relaxed),
        cpu_secs(watchdog)?,
        cpu_secs(nats)?,
        cpu_secs(me)?,
        Instant::now(),
    );
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let el = t0.elapsed().as_secs_f64();
    let rate = (acked.load(Ordering::Relaxed) - a0) as f64 / el;
    let wd = (cpu_secs(watchdog)? - w0) / el;
    let ns = (cpu_secs(nats)? - n0) / el;
    let sim = (cpu_secs(me)? - m0) / el;
    let nats_rss = status_mb(nats, "VmRSS:")?;
    let wd_rss = status_mb(watchdog, "VmRSS:")?;
    // The watchdog's view: every simulated worker alive.
    let dash = fleet.dashboards.first().ok_or("no dashboard")?.clone();
    let (sent, acked_total) = (
        hb_sent.load(Ordering::Relaxed),
        acked.load(Ordering::Relaxed),
    );
    let body =
        tokio::task::spawn_blocking(move || minions_tests::web::get(&format!("{dash}/api/fleet")))
            .await??
            .1;
    let view: serde_json::Value = serde_json::from_str(&body)?;
    let states = &view["states"];
    let alive: u64 = ["joining", "idle", "busy", "draining"]
        .iter()
        .filter_map(|s| states[*s].as_u64())
        .sum();
    let dead = states["dead"].as_u64().unwrap_or(0) + states["suspect"].as_u64().unwrap_or(0);
    let folded = view["counters"]["done"].as_u64().unwrap_or(0);
    let seen = view["heartbeats"].as_u64().unwrap_or(0);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    let _ = beats.await;
    let _ = feeder.await;
    out!(
        "scale: {n} workers: {rate:.0} shards/s, watchdog {wd:.3} cores {wd_rss:.0} MB, nats-server {ns:.3} cores {nats_rss:.0} MB, simulator {sim:.2} cores; watchdog: {alive} alive, {dead} dead or suspect, {seen} of {sent} heartbeats taken, {folded} of {acked_total} done events folded"
    );
    Ok(format!(
        "{n} simulated workers in one process (each: a heartbeat a second with what it holds; \
         pull one shard, store `started` and `done` events, ack with confirmation, repeat), \
         one nats-server, one watchdog; shards kept queued 10,000 ahead. Measured over {secs} s \
         after 5 s of warm-up. The simulator shares the 2 cores with the servers, so the rate \
         is bounded by this machine, not by the watchdog.\n\n\
         | workers | shards/s end to end | watchdog CPU (cores) | watchdog RSS MB | nats-server CPU (cores) | nats-server RSS MB | simulator CPU (cores) | alive / dead or suspect (watchdog) | heartbeats taken / sent | `done` events folded / acked |\n\
         |---:|---:|---:|---:|---:|---:|---:|---|---|---:|\n\
         | {n} | {rate:.0} | {wd:.3} | {wd_rss:.0} | {ns:.3} | {nats_rss:.0} | {sim:.2} | {alive} / {dead} | {seen} / {sent} | {folded} / {acked_total} |\n"
    ))
}

// ---------------------------------------------------------------- 5. submission

/// Runs `minions submit` on `records` records; returns (seconds, peak RSS
/// MB from VmHWM sampled every 10 ms, shards).
fn submit_run(fleet: &Fleet, records: usize, job: &str) -> Result<(f64, f64, usize)> {
    let input = fleet.dir.path().join(format!("{job}.jsonl"));
    write_corpus(&input, records)?;
    let shard_size = 1000;
    let t = Instant::now();
    let mut child = std::process::Command::new(minions_tests::bin("minions")?)
        .args(["submit", "--model", "noop", "--input"])
        .arg(&input)
        .args(["--job", job, "--shard-size", &shard_size.to_string()])
        .envs(fleet.cli_env())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let mut peak: f64 = 0.0;
    loop {
        if let Ok(hwm) = status_mb(pid, "VmHWM:") {
            peak = peak.max(hwm);
        }
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read as _;
                    e.read_to_string(&mut err)?;
                }
                return Err(format!("minions submit failed: {err}").into());
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let secs = t.elapsed().as_secs_f64();
    std::fs::remove_file(&input)?;
    Ok((secs, peak, records.div_ceil(shard_size)))
}

fn submission(big: usize) -> Result<String> {
    let fleet = Fleet::local()?;
    fleet.push_model("noop", NOOP)?;
    let mut rows = Vec::new();
    for (i, records) in [big / 10, big].into_iter().enumerate() {
        let (secs, peak, shards) = submit_run(&fleet, records, &format!("submit{i}"))?;
        out!("submit: {records} records in {secs:.1} s, peak RSS {peak:.1} MB");
        rows.push(format!(
            "| {records} | {shards} | {secs:.1} | {:.0} | {peak:.1} |",
            records as f64 / secs
        ));
    }
    Ok(format!(
        "`minions submit` (release build) of a JSON Lines input of short sentences, shard size \
         1,000, local-folder store, no workers running: it reads the input once, uploads each \
         shard's input and the job spec, and publishes one message per shard with confirmation. \
         Peak memory is the process's VmHWM sampled every 10 ms.\n\n\
         | records | shards | seconds | records/s | peak RSS MB |\n|---:|---:|---:|---:|---:|\n{}\n",
        rows.join("\n")
    ))
}

// ---------------------------------------------------------------- main

/// This machine, and the nats-server version the runs used.
fn machine_with_nats() -> String {
    let nats = std::process::Command::new(
        std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".into()),
    )
    .arg("--version")
    .output()
    .ok()
    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    .unwrap_or_default();
    format!("{}, {nats}", machine())
}

/// What `--help` prints.
const USAGE: &str = "\
What Minions costs next to the work it carries: overhead, dispatch, latency, scale, submission.

Usage: bench_fleet [--only SECTIONS] [--write]
  (source deploy/tools.sh --test; cargo build --release --workspace --bins first)

  --only LIST   comma-separated: overhead,dispatch,latency,scale,submit (all)
  --write       put the Markdown into BENCHMARKS.md between its markers
";

#[tokio::main]
async fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let only: Option<Vec<String>> =
        arg("--only").map(|s| s.split(',').map(str::to_owned).collect());
    let runs = |s: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == s));
    let started = Instant::now();
    let command = command_line();
    let mut doc = format!(
        "## Overhead, dispatch, latency, scale and submission\n\n\
         Made by `source deploy/tools.sh --test && cargo build --release --workspace --bins && target/release/{command}` \
         on {} UTC, {}.\n\n",
        utc_now(),
        machine_with_nats()
    );
    if runs("overhead") {
        doc.push_str("### Overhead: Minions against in-process inference\n\n");
        doc.push_str(&overhead(num("--texts", 2048)? as usize).await?);
        doc.push('\n');
    }
    if runs("dispatch") {
        doc.push_str("### Dispatch: shards/s against raw JetStream\n\n");
        doc.push_str(&dispatch(num("--shards", 1000)? as usize).await?);
        doc.push('\n');
    }
    if runs("latency") {
        doc.push_str("### Latency\n\n");
        doc.push_str(
            &latency(
                num("--repeats", 30)? as usize,
                num("--failovers", 3)? as usize,
            )
            .await?,
        );
        doc.push('\n');
    }
    if runs("scale") {
        doc.push_str("### Scale: 1,000 simulated workers\n\n");
        doc.push_str(&scale(num("--workers", 1000)? as usize, num("--secs", 20)?).await?);
        doc.push('\n');
    }
    if runs("submit") {
        doc.push_str("### Submission of a large input\n\n");
        doc.push_str(&submission(num("--records", 1_000_000)? as usize)?);
        doc.push('\n');
    }
    out!("\n{doc}");
    if flag("--write") {
        let p = write_section("bench_fleet", &doc)?;
        out!("written to {}", p.display());
    }
    out!("(took {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}
