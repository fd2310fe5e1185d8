//! Benchmark: the worker's inference next to ONNX Runtime (the engine
//! deployed for CPU embeddings) and sentence-transformers (PyTorch, the f32
//! accuracy reference) on the same machine, texts and model, in one run.
//!
//! all-MiniLM-L6-v2 over real English texts of 10–600 characters (CPython's
//! bundled reference documentation, cut by `tests/bench/texts.py`).
//! sentence-transformers (`tests/bench/reference.py`) runs once; ONNX
//! Runtime (`tests/bench/onnx_reference.py`) and Minions' own model code
//! then run in rounds side by side, f32 and int8; ratios are of means.
//! Outputs are compared row by row: max abs difference and cosine.
//!
//!   bash tests/bench/inference.sh          # installs, builds, runs, writes
//!
//! which runs, after installing both references into `.tools/`:
//!
//!   target/release/bench_inference --python .tools/bench-venv/bin/python \
//!     --onnx-python .tools/onnx-venv/bin/python --write
//!
//! Its flags are in [`USAGE`], which `--help` prints.

use std::path::Path;
use std::time::Instant;

use candle_core::Device;
use minions_tests::bench::{
    arg, bench_python, bench_texts, flag, help, job, machine, num, utc_now, wait_workers,
    write_section,
};
use minions_tests::{Result, out, real_model_dir, workspace_root};
use minions_worker::model::{
    Batching, BertEmbedder, DeviceChoice, Precision, describe_device, select_device,
};
use minions_worker::model::{CPU_PATH_ENV, CpuPath, PeakRate, measure_peak};

/// One throughput measurement and the vectors it produced.
struct Run {
    name: String,
    texts_per_s: f64,
    vectors: Vec<f32>,
}

/// Runs one of the reference scripts in `tests/bench/` with `python`:
/// `args` after the script, the vectors file last; it prints one JSON line
/// (`name`, `texts_per_s`) and writes little-endian f32 vectors.
fn script(python: &Path, name: &str, args: &[&std::ffi::OsStr]) -> Result<Run> {
    let dir = tempfile::tempdir()?;
    let vectors = dir.path().join("vectors.f32");
    let script = workspace_root().join("tests/bench").join(name);
    let out = std::process::Command::new(python)
        .arg(&script)
        .args(args)
        .arg(&vectors)
        .stderr(std::process::Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status).into());
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let line = line.lines().last().unwrap_or_default();
    let report: serde_json::Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("{name} printed {line:?}: {e}"))?;
    let bytes = std::fs::read(&vectors)?;
    Ok(Run {
        name: report["name"].as_str().unwrap_or(name).to_owned(),
        texts_per_s: report["texts_per_s"].as_f64().ok_or("no texts_per_s")?,
        vectors: bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    })
}

/// sentence-transformers (`tests/bench/reference.py`) once.
fn sentence_transformers(
    python: &Path,
    model: &Path,
    texts: &Path,
    batch: u64,
    threads: u64,
    torch_device: &str,
) -> Result<Run> {
    let (batch, threads) = (batch.to_string(), threads.to_string());
    let args: [&std::ffi::OsStr; 8] = [
        model.as_os_str(),
        texts.as_os_str(),
        "--batch".as_ref(),
        batch.as_ref(),
        "--threads".as_ref(),
        threads.as_ref(),
        "--device".as_ref(),
        torch_device.as_ref(),
    ];
    script(python, "reference.py", &args)
}

/// ONNX Runtime (`tests/bench/onnx_reference.py`) once, in `precision`.
fn onnx_runtime(
    python: &Path,
    model: &Path,
    texts: &Path,
    precision: Precision,
    threads: u64,
    batch: u64,
) -> Result<Run> {
    let export = workspace_root().join(".tools/onnx-models").join(
        model
            .parent()
            .and_then(Path::file_name)
            .unwrap_or(model.as_os_str()),
    );
    let (threads, batch) = (threads.to_string(), batch.to_string());
    let args: [&std::ffi::OsStr; 9] = [
        model.as_os_str(),
        export.as_os_str(),
        texts.as_os_str(),
        "--precision".as_ref(),
        precision.as_str().as_ref(),
        "--threads".as_ref(),
        threads.as_ref(),
        "--batch-texts".as_ref(),
        batch.as_ref(),
    ];
    script(python, "onnx_reference.py", &args)
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

/// How `a`'s rows differ from `b`'s.
struct Diff {
    /// Largest absolute difference of one value.
    max: f64,
    /// Mean cosine of a row to its counterpart.
    mean_cos: f64,
    /// Smallest cosine of a row to its counterpart.
    min_cos: f64,
}

/// Compares `a`'s rows against `b`'s.
fn compare(a: &[f32], b: &[f32], dim: usize) -> Result<Diff> {
    if a.len() != b.len() || dim == 0 {
        return Err(format!("{} values against {}", a.len(), b.len()).into());
    }
    let mut max = 0f64;
    let (mut sum, mut min_cos) = (0f64, f64::INFINITY);
    let rows = a.len() / dim;
    for (x, y) in a.chunks_exact(dim).zip(b.chunks_exact(dim)) {
        let (mut dot, mut nx, mut ny) = (0f64, 0f64, 0f64);
        for (&p, &q) in x.iter().zip(y) {
            max = max.max(f64::from((p - q).abs()));
            dot += f64::from(p) * f64::from(q);
            nx += f64::from(p) * f64::from(p);
            ny += f64::from(q) * f64::from(q);
        }
        let cos = dot / (nx.sqrt() * ny.sqrt()).max(1e-30);
        sum += cos;
        min_cos = min_cos.min(cos);
    }
    Ok(Diff {
        max,
        mean_cos: sum / rows as f64,
        min_cos,
    })
}

/// The flags this run was given, less `--python` (a machine path) and
/// `--write`, each with a leading space.
fn flags_shown() -> String {
    let mut shown = String::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--python" | "--onnx-python" => {
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
fn ours_only(
    model_dir: &Path,
    device: &Device,
    texts_path: &Path,
    texts: &[String],
    batch: Batching,
) -> Result<()> {
    let mut runs = Vec::new();
    let only = arg("--precision");
    let mut fleet = match flag("--fleet") && device.is_cpu() {
        true => Some(LocalFleet::start(model_dir, texts_path)?),
        false => None,
    };
    for precision in [Precision::F32, Precision::Int8] {
        if only.as_deref().is_some_and(|p| p != precision.as_str()) {
            continue;
        }
        let model = BertEmbedder::load(model_dir, device, precision)?;
        let r = ours(precision.as_str(), &model, texts, batch)?;
        out!("{}: {:.1} texts/s", r.name, r.texts_per_s);
        if device.is_cpu() {
            let peak = measure_peak(CpuPath::get());
            let peak = match precision {
                Precision::Int8 => peak.int8,
                _ => peak.f32,
            };
            let s = share(model.product_macs(texts)?, texts.len(), r.texts_per_s, peak);
            out!(
                "{} on the {} path: {s} of the measured peak",
                r.name,
                CpuPath::get().name()
            );
        }
        if let Some(f) = &mut fleet {
            let rate = f.run(texts_path, texts.len(), precision)?;
            out!(
                "fleet {}: {:.3}× in-process",
                precision.as_str(),
                rate / r.texts_per_s
            );
        }
        runs.push((r, model.dim()));
    }
    if let [(f, dim), (q, _)] = &runs[..] {
        let d = compare(&q.vectors, &f.vectors, *dim)?;
        out!(
            "int8 against f32: max abs diff {:.2e}, mean cosine {:.6}, min cosine {:.6}",
            d.max,
            d.mean_cos,
            d.min_cos
        );
    }
    Ok(())
}

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What `--help` prints.
const USAGE: &str = "\
Minions' model code next to ONNX Runtime and sentence-transformers on this machine, in one run.

Usage: bench_inference [--python PATH] [--onnx-python PATH] [--write] [FLAGS]
  (bash tests/bench/inference.sh installs both references, builds, runs, writes)

  --texts N          texts to embed (3000)
  --batch B          sentence-transformers' batch (64)
  --onnx-batch B     ONNX Runtime's passes: at most B texts each, length-sorted (16, its best here)
  --our-batch B      our passes: at most B texts each (the worker's default)
  --batch-tokens T   our passes: at most T tokens each, padding included (the worker's default)
  --threads T        the references' threads; 0 = cores (0)
  --rounds R         rounds of ONNX Runtime and ours side by side, per precision (3)
  --device D         cpu (default), metal or cuda: ours on that device, sentence-transformers
                     on PyTorch's matching one (mps, cuda); metal and cuda need this binary
                     built with --features minions-worker/metal or minions-worker/cuda
  --python PATH      a Python with sentence-transformers (the f32 accuracy reference)
  --onnx-python PATH a Python with optimum and onnxruntime (the speed yardstick); without it,
                     ratios are against sentence-transformers
  --fleet            also run the texts as one job through a local fleet of one worker (its own
                     nats-server and store; the workspace's release binaries) in each round,
                     beside ours in the same precision, the two taking turns going first
  --paths            also run ours once per CPU kernel path this CPU has (MINIONS_CPU_PATH)
  --ours-only        our precisions only, no reference runs (for profiling; with --fleet, each
                     precision's job follows its in-process run)
  --precision P      with --ours-only: f32 or int8 alone
  --shard N          our code embeds N texts per call, as a worker per shard (all in one)
  --packing N        the texts as jobs in shards of N through two local fleets of one worker,
                     one running a shard at a time (--max-shards 1) and one packing small
                     shards into shared passes (the default), --rounds R each, turn about;
                     prints a Markdown row per precision (with --precision, that one alone):
                     texts/s of each, the ratio, shards per pass
  --write            put the Markdown into BENCHMARKS.md between its markers
";

/// `rate` texts/s as a share of `peak`: the linear layers' multiply-adds
/// (`macs` for all `texts`) per second against the instruction's measured
/// rate; `"—"` without one.
fn share(macs: u64, texts: usize, rate: f64, peak: Option<PeakRate>) -> String {
    match peak {
        Some(p) => {
            let achieved = macs as f64 * rate / texts.max(1) as f64;
            format!(
                "{:.0}% ({:.1} of {:.1} GMAC/s, `{}`)",
                100.0 * achieved / p.macs_per_s,
                achieved / 1e9,
                p.macs_per_s / 1e9,
                p.instruction
            )
        }
        None => "—".to_owned(),
    }
}

/// `--paths`: this binary again with `--ours-only` under each CPU path's
/// cap (the path is fixed per process), its texts/s per precision and
/// their shares of the path's measured peak (`macs` for all `texts`): one
/// Markdown row per path.
fn per_path(texts: u64, macs: u64) -> Result<Vec<String>> {
    let exe = std::env::current_exe()?;
    let mut rows = Vec::new();
    for path in CpuPath::ALL.into_iter().filter(|p| *p <= CpuPath::best()) {
        let out = std::process::Command::new(&exe)
            .args(["--ours-only", "--texts", &texts.to_string()])
            .args(
                arg("--python")
                    .map(|p| ["--python".to_owned(), p])
                    .into_iter()
                    .flatten(),
            )
            .env(CPU_PATH_ENV, path.name())
            .stderr(std::process::Stdio::inherit())
            .output()?;
        if !out.status.success() {
            return Err(format!("{} path run failed ({})", path.name(), out.status).into());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let rate = |p: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{p}: ")))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| format!("{} path: no {p} figure in {text:?}", path.name()))
        };
        let (f, q) = (rate("f32")?, rate("int8")?);
        let peak = measure_peak(path);
        let (fs, qs) = (
            share(macs, texts as usize, f, peak.f32),
            share(macs, texts as usize, q, peak.int8),
        );
        out!(
            "path {}: f32 {f:.1} texts/s, {fs} of peak; int8 {q:.1} texts/s, {qs} of peak",
            path.name()
        );
        rows.push(format!(
            "| `{}` | {f:.1} | {fs} | {q:.1} | {qs} |",
            path.name()
        ));
    }
    Ok(rows)
}

/// `--fleet`: a local fleet of one worker with every thread, the model
/// pushed; its jobs are timed from `minions submit` to `done`.
struct LocalFleet {
    fleet: minions_tests::Fleet,
    /// Texts per shard of its jobs.
    shard: u64,
    /// The first 64 texts: a job of them loads the model, as the
    /// in-process run's warm-up does.
    warm: std::path::PathBuf,
    warm_count: usize,
    jobs: usize,
    /// The precisions whose warm-up job has run.
    warmed: Vec<Precision>,
}

impl LocalFleet {
    fn start(model_dir: &Path, texts: &Path) -> Result<Self> {
        Self::start_with(model_dir, texts, 256, &[])
    }

    /// [`LocalFleet::start`] with jobs in shards of `shard` texts and the
    /// worker started with `worker_args`; its packs of shards are logged.
    fn start_with(
        model_dir: &Path,
        texts: &Path,
        shard: u64,
        worker_args: &[&str],
    ) -> Result<Self> {
        let mut fleet = minions_tests::Fleet::local()?;
        fleet.cli(&[
            "model",
            "push",
            &model_dir.display().to_string(),
            "--name",
            "minilm",
        ])?;
        fleet.worker_env.push((
            "RUST_LOG".to_owned(),
            "info,minions_worker::pack=debug".to_owned(),
        ));
        fleet.add_worker(worker_args)?;
        wait_workers(&fleet, 1)?;
        let warm = fleet.dir.path().join("warm.jsonl");
        let head: String = std::fs::read_to_string(texts)?
            .lines()
            .take(64)
            .map(|l| format!("{l}\n"))
            .collect();
        let warm_count = head.lines().count();
        std::fs::write(&warm, head)?;
        Ok(Self {
            fleet,
            shard,
            warm,
            warm_count,
            jobs: 0,
            warmed: Vec::new(),
        })
    }

    /// The texts as one job in `precision` (in the fleet's shards: 256,
    /// the default, unless started otherwise), after a warm-up job the
    /// first time in that precision: texts/s.
    fn run(&mut self, texts: &Path, n: usize, precision: Precision) -> Result<f64> {
        let p = precision.as_str();
        self.jobs += 1;
        if !self.warmed.contains(&precision) {
            self.warmed.push(precision);
            job(
                &self.fleet,
                &self.warm,
                self.warm_count,
                &format!("warm-{p}"),
                256,
                p,
            )?;
        }
        let name = format!("fleet-{p}-{}", self.jobs);
        let submitted = minions_schemas::time::now_ms();
        let rate = job(&self.fleet, texts, n, &name, self.shard, p)?;
        out!(
            "Minions fleet, one worker ({p}, shards of {}): {rate:.1} texts/s",
            self.shard
        );
        self.breakdown(&name, n as f64 / rate, submitted)?;
        Ok(rate)
    }

    /// Passes that shards shared so far, and the shards in them, from the
    /// worker's log.
    fn packs(&self) -> (u64, u64) {
        let log = std::fs::read_to_string(&self.fleet.workers[0].log).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains("embedding pack ran"))
            .filter_map(|l| {
                let at = l.find("shards=")? + "shards=".len();
                l[at..].split(' ').next()?.parse::<u64>().ok()
            })
            .fold((0, 0), |(p, s), n| (p + 1, s + n))
    }

    /// Where a job of `secs` submitted at `submitted` (ms) spent its time,
    /// from its events: the submit, the wait for the first shard, and from
    /// the first shard's start to the last one's `done`, of which the
    /// shards' inference (timed inside the worker, summed) is how much.
    fn breakdown(&self, job: &str, secs: f64, submitted: u64) -> Result<()> {
        use minions_schemas::messages::EventKind;
        let events = tokio::runtime::Runtime::new()?.block_on(self.fleet.events(job))?;
        let (mut published, mut first, mut last) = (u64::MAX, u64::MAX, 0u64);
        let mut compute = 0u64;
        for e in &events {
            match e.kind {
                EventKind::Submitted { .. } => published = published.min(e.at_ms),
                EventKind::Started => first = first.min(e.at_ms),
                EventKind::Done { compute_ms, .. } => {
                    last = last.max(e.at_ms);
                    compute += compute_ms;
                }
                _ => {}
            }
        }
        if published == u64::MAX || first == u64::MAX || last == 0 {
            return Err(format!("job {job}: no submitted, started or done event").into());
        }
        out!(
            "  {job}: {:.0} ms in all: submit {} ms, to the first shard {} ms, \
             first start to last done {} ms, of which inference {compute} ms",
            secs * 1000.0,
            published.saturating_sub(submitted),
            first.saturating_sub(published),
            last.saturating_sub(first),
        );
        Ok(())
    }
}

/// `--packing N`: the texts as jobs in shards of N on two local fleets of
/// one worker each, one holding a shard at a time (`--max-shards 1`) and
/// one packing small shards into shared passes (the default), taking turns
/// going first, round by round.
fn packing(model_dir: &Path, texts_path: &Path, n: usize, shard: u64) -> Result<()> {
    let rounds = num("--rounds", 3)?;
    let only = arg("--precision");
    let mut fleets = [
        LocalFleet::start_with(model_dir, texts_path, shard, &["--max-shards", "1"])?,
        LocalFleet::start_with(model_dir, texts_path, shard, &[])?,
    ];
    for p in [Precision::F32, Precision::Int8] {
        if only.as_deref().is_some_and(|o| o != p.as_str()) {
            continue;
        }
        let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let before = fleets[1].packs();
        for round in 0..rounds {
            for k in [round as usize % 2, 1 - round as usize % 2] {
                rates[k].push(fleets[k].run(texts_path, n, p)?);
            }
        }
        let (passes, shards) = fleets[1].packs();
        let (passes, shards) = (passes - before.0, shards - before.1);
        let all = rounds * n.div_ceil(shard as usize) as u64;
        let mean = |r: &[f64]| r.iter().sum::<f64>() / r.len().max(1) as f64;
        let each = |r: &[f64]| {
            r.iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out!(
            "| {} | {shard} | {:.1} ({}) | {:.1} ({}) | **{:.3}** | {:.2} |",
            p.as_str(),
            mean(&rates[0]),
            each(&rates[0]),
            mean(&rates[1]),
            each(&rates[1]),
            mean(&rates[1]) / mean(&rates[0]),
            // Shards per pass: shared passes, and the shards that ran alone.
            all as f64 / (passes + all.saturating_sub(shards)).max(1) as f64,
        );
    }
    Ok(())
}

/// Several runs of one engine in one precision: their throughputs and the
/// first run's vectors.
struct Runs {
    name: String,
    rates: Vec<f64>,
    vectors: Vec<f32>,
}

impl Runs {
    /// Adds `r` to `runs`, starting them with it.
    fn add(runs: &mut Option<Runs>, r: Run) {
        match runs {
            Some(runs) => runs.rates.push(r.texts_per_s),
            None => {
                *runs = Some(Runs {
                    name: r.name,
                    rates: vec![r.texts_per_s],
                    vectors: r.vectors,
                });
            }
        }
    }

    fn mean(&self) -> f64 {
        self.rates.iter().sum::<f64>() / self.rates.len().max(1) as f64
    }

    /// `mean (run, run, …)`.
    fn shown(&self) -> String {
        let each: Vec<String> = self.rates.iter().map(|r| format!("{r:.1}")).collect();
        format!("{:.1} ({})", self.mean(), each.join(", "))
    }
}

fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    minions_worker::process_env::fix_process_env();
    let started = Instant::now();
    let n = num("--texts", 3000)?;
    let batch = num("--batch", 64)?;
    let onnx_batch = num("--onnx-batch", 16)?;
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
        return ours_only(&model_dir, &device, &texts_path, &texts, ours_batch);
    }
    if let Some(shard) = arg("--packing") {
        let shard: u64 = shard
            .parse()
            .map_err(|_| format!("--packing {shard}: expected texts per shard"))?;
        return packing(&model_dir, &texts_path, texts.len(), shard.max(1));
    }
    let on = match &device {
        Device::Cpu => format!("CPU, {} kernels", CpuPath::get().name()),
        Device::Metal(_) => "Metal".to_owned(),
        d => describe_device(d),
    };
    let onnx_python = arg("--onnx-python").map(std::path::PathBuf::from);
    if onnx_python.is_some() && !device.is_cpu() {
        return Err("--onnx-python: ONNX Runtime runs on the CPU here; drop --device".into());
    }
    let onnx = |precision| -> Result<Option<Run>> {
        onnx_python
            .as_deref()
            .map(|py| onnx_runtime(py, &model_dir, &texts_path, precision, threads, onnx_batch))
            .transpose()
    };
    let st = || {
        sentence_transformers(
            &python,
            &model_dir,
            &texts_path,
            batch,
            threads,
            torch_device,
        )
    };

    // sentence-transformers once (the accuracy reference), then rounds of
    // ONNX Runtime and ours side by side, precision by precision: this
    // machine's speed drifts by 10-20% within minutes, so each ratio is of
    // means over the same stretch of time.
    let st0 = st()?;
    out!("{}: {:.1} texts/s", st0.name, st0.texts_per_s);
    let rounds = num("--rounds", 3)?.max(1);
    let models = [
        BertEmbedder::load(&model_dir, &device, Precision::F32)?,
        BertEmbedder::load(&model_dir, &device, Precision::Int8)?,
    ];
    let dim = models[0].dim();
    let mut ort: [Option<Runs>; 2] = [None, None];
    let mut mine: [Option<Runs>; 2] = [None, None];
    let mut fleet = match flag("--fleet") && device.is_cpu() {
        true => Some(LocalFleet::start(&model_dir, &texts_path)?),
        false => None,
    };
    let mut through_fleet: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, precision) in [Precision::F32, Precision::Int8].into_iter().enumerate() {
            if let Some(r) = onnx(precision)? {
                out!("{}: {:.1} texts/s", r.name, r.texts_per_s);
                Runs::add(&mut ort[i], r);
            }
            // In-process and the fleet take turns going first, so that a
            // drift of the machine's speed within a round, or what the
            // run before leaves behind, favours neither side.
            let fleet_first = round % 2 == 1;
            let mut through = |fleet: &mut Option<LocalFleet>| -> Result<()> {
                if let Some(f) = fleet {
                    through_fleet[i].push(f.run(&texts_path, texts.len(), precision)?);
                }
                Ok(())
            };
            if fleet_first {
                through(&mut fleet)?;
            }
            let name = format!("Minions worker ({}, {on})", precision.as_str());
            let r = ours(&name, &models[i], &texts, ours_batch)?;
            out!("{}: {:.1} texts/s", r.name, r.texts_per_s);
            Runs::add(&mut mine[i], r);
            if !fleet_first {
                through(&mut fleet)?;
            }
        }
    }
    drop(fleet);
    let [Some(ours_f32), Some(ours_int8)] = mine else {
        return Err("no runs of ours".into());
    };

    // Each row: what, texts/s, ratio to its yardstick, max abs diff to
    // sentence-transformers, cosine to its own f32 (mean, min).
    let mut rows = vec![format!(
        "| {} | {:.1} | — | 0 | — |",
        st0.name, st0.texts_per_s
    )];
    let mut yardstick = [st0.texts_per_s, st0.texts_per_s];
    let against = if let [Some(f), Some(q)] = &ort {
        yardstick = [f.mean(), q.mean()];
        let d = compare(&f.vectors, &st0.vectors, dim)?;
        rows.push(format!(
            "| {} | {} | 1.000 | {:.1e} | 1.000000 |",
            f.name,
            f.shown(),
            d.max
        ));
        let dq = compare(&q.vectors, &f.vectors, dim)?;
        let dq_st = compare(&q.vectors, &st0.vectors, dim)?;
        rows.push(format!(
            "| {} | {} | 1.000 | {:.1e} | {:.6} (min {:.6}) |",
            q.name,
            q.shown(),
            dq_st.max,
            dq.mean_cos,
            dq.min_cos
        ));
        "ONNX Runtime in the same precision"
    } else {
        "sentence-transformers"
    };
    let ours_runs = [ours_f32, ours_int8];
    for (r, base) in ours_runs.iter().zip(yardstick) {
        let d_st = compare(&r.vectors, &st0.vectors, dim)?;
        let d_f32 = compare(&r.vectors, &ours_runs[0].vectors, dim)?;
        out!(
            "{}: {:.3}× {against}, max abs diff to sentence-transformers {:.2e}, cosine to our f32 mean {:.6} min {:.6}",
            r.name,
            r.mean() / base,
            d_st.max,
            d_f32.mean_cos,
            d_f32.min_cos
        );
        rows.push(format!(
            "| {} | {} | **{:.3}** | {:.1e} | {:.6} (min {:.6}) |",
            r.name,
            r.shown(),
            r.mean() / base,
            d_st.max,
            d_f32.mean_cos,
            d_f32.min_cos
        ));
    }
    for ((r, rates), p) in ours_runs.iter().zip(&through_fleet).zip(["f32", "int8"]) {
        if rates.is_empty() {
            continue;
        }
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        let each: Vec<String> = rates.iter().map(|r| format!("{r:.1}")).collect();
        let ratio = mean / r.mean();
        out!("fleet {p}: {ratio:.3}× in-process");
        rows.push(format!(
            "| Minions fleet, one worker ({p}, shards of 256, submit to done) | {mean:.1} ({}) | {ratio:.3} of in-process | — | — |",
            each.join(", ")
        ));
    }
    // The share of this CPU's measured peak each engine's linear layers
    // reach: the products' multiply-adds over the run's time (attention's
    // and the rest of the run's work counted as time, not as products).
    let macs = models[0].product_macs(&texts)?;
    let peak = measure_peak(CpuPath::get());
    let best = measure_peak(CpuPath::best());
    let mut shares = Vec::new();
    for (i, p) in ["f32", "int8"].into_iter().enumerate() {
        let [ours_peak, best_peak] = match i {
            0 => [peak.f32, best.f32],
            _ => [peak.int8, best.int8],
        };
        let o = share(macs, texts.len(), ours_runs[i].mean(), ours_peak);
        out!("ours {p}: {o} of the measured peak");
        let mut line = format!("ours {p} {o}");
        if let Some(r) = &ort[i] {
            let t = share(macs, texts.len(), r.mean(), best_peak);
            out!("ONNX Runtime {p}: {t} of the measured peak");
            line.push_str(&format!(", ONNX Runtime {p} {t}"));
        }
        shares.push(line);
    }
    let shares = format!(
        "\n\nShare of this CPU's measured peak (the linear layers' {:.3} × 10¹² multiply-adds \
         over each mean's time, against the instruction's rate on every core, measured after \
         the rounds; ONNX Runtime against the best path's): {}.",
        macs as f64 / 1e12,
        shares.join("; ")
    );
    let paths = if flag("--paths") && device.is_cpu() {
        let rows = per_path(n, macs)?;
        format!(
            "\n\nEach CPU kernel path this CPU has, forced in turn (`{CPU_PATH_ENV}`, one process \
             each, ours alone; the f32 products are gemm's, which picks its own instructions, so \
             the f32 column moves with our other kernels only; each share is of the path's own \
             instruction, measured after the run):\n\n\
             | path | f32 texts/s | f32 share of peak | int8 texts/s | int8 share of peak |\n\
             |---|---:|---:|---:|---:|\n{}",
            rows.join("\n")
        )
    } else {
        String::new()
    };
    let lens: Vec<usize> = texts.iter().map(|t| t.chars().count()).collect();
    let doc = format!(
        "## Inference against ONNX Runtime and sentence-transformers\n\n\
         Made by `bash tests/bench/inference.sh{}` on {} UTC, {}.\n\n\
         all-MiniLM-L6-v2, {} texts of {}–{} characters from CPython's bundled reference \
         documentation, {threads} threads each. ONNX Runtime runs optimum's export of the same \
         model folder (f32: through onnxruntime's transformer optimizer; int8: `quantize_dynamic`, \
         per-channel, MatMul only) with the folder's tokenizer, the same truncation, \
         length-sorted passes of {onnx_batch} texts and mean pooling; sentence-transformers runs \
         batches of {batch}; ours runs passes of at most {} texts and {} tokens, as a worker does \
         by default. sentence-transformers runs once first; then {rounds} rounds of ONNX Runtime \
         and ours side by side, precision by precision (texts/s: mean (each run); with the fleet, \
         ours in-process and the fleet's job take turns going first); each ratio \
         is of means, against {against}. Max abs diff is against \
         sentence-transformers' vectors; cosine against the same engine's f32 vectors, row by \
         row.\n\n\
         | what | texts/s | ratio | max abs diff | cosine to f32 |\n|---|---:|---:|---:|---:|\n{}{shares}{paths}\n",
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
