//! Helpers of the benchmark binaries (`tests/bench/src/bin/bench_*.rs`, package minions-bench): flags, and
//! what `/proc` says about a process, a job's events followed live.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use minions_schemas::messages::{
    EventKind, InputDescription, JobSpec, ModelFamily, Precision, ShardEvent,
};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, ModelHash, ModelName, SCHEMA_VERSION, decode, limits, subjects};
use minions_worker::model::tiny::TinySpec;

use crate::Result;

/// Prints a result line to stdout (the tables are the point of a benchmark).
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// The value after flag `name` on the command line.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Whether `--help` or `-h` is on the command line; prints `usage` when it
/// is, so that a benchmark binary can return before running anything.
pub fn help(usage: &str) -> bool {
    let asked = flag("--help") || flag("-h");
    if asked {
        crate::out!("{}", usage.trim());
    }
    asked
}

/// CPU seconds (user + system) process `pid` has used, from `/proc`.
pub fn cpu_secs(pid: u32) -> crate::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit(')').next().ok_or("bad /proc stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the name: state is [0]; utime [11], stime [12] (in ticks).
    let utime: f64 = f.get(11).ok_or("no utime")?.parse()?;
    let stime: f64 = f.get(12).ok_or("no stime")?.parse()?;
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.map_or(100.0, |v| v as f64);
    Ok((utime + stime) / tck)
}

/// A `/proc/PID/status` memory figure in MB (`key` is `VmRSS:`, `VmHWM:`...).
pub fn status_mb(pid: u32, key: &str) -> crate::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or_else(|| format!("no {key} in /proc/{pid}/status"))?
        .parse()?;
    Ok(kb / 1024.0)
}

/// Number flag `name`, or `default` when absent.
pub fn num(name: &str, default: u64) -> crate::Result<u64> {
    Ok(match arg(name) {
        Some(v) => v.parse()?,
        None => default,
    })
}

/// List flag `name` (comma-separated values), or `default` when absent.
pub fn list<T>(name: &str, default: &str) -> crate::Result<Vec<T>>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    Ok(arg(name)
        .unwrap_or_else(|| default.into())
        .split(',')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?)
}

/// The watchdog binary a benchmark runs: `--watchdog PATH`, else the
/// release build when it exists, else the test build.
pub fn watchdog_bin() -> crate::Result<std::path::PathBuf> {
    let release = crate::workspace_root().join("target/release/minions-watchdog");
    Ok(match arg("--watchdog") {
        Some(p) => p.into(),
        None if release.is_file() => release,
        None => crate::bin("minions-watchdog")?,
    })
}

/// A benchmark's fresh nats-server with the streams created, a scratch
/// dir and a local-directory store in it.
pub struct LocalSite {
    /// A client of the server.
    pub client: async_nats::Client,
    /// JetStream on that client.
    pub js: async_nats::jetstream::Context,
    /// The store's URL (`file://...`).
    pub store_url: String,
    /// The store's folder (`dir/store`).
    pub store: std::path::PathBuf,
    /// The server.
    pub nats: crate::NatsServer,
    /// The scratch dir (named `prefix...`).
    pub dir: tempfile::TempDir,
}

impl LocalSite {
    /// Starts a nats-server, creates the streams, and makes the scratch dir
    /// `prefix...`.
    pub async fn start(prefix: &str) -> crate::Result<Self> {
        let dir = crate::scratch(prefix)?;
        let nats = crate::NatsServer::start()?;
        let store = dir.path().join("store");
        let store_url = format!("file://{}", store.display());
        let client = async_nats::connect(nats.url()).await?;
        let js = async_nats::jetstream::new(client.clone());
        minions_endpoints::streams::ensure(&js, &Default::default()).await?;
        Ok(Self {
            client,
            js,
            store_url,
            store,
            nats,
            dir,
        })
    }
}

/// Whether bare flag `name` is on the command line.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// The command line as run, program paths cut to their file names (for
/// "made by" lines: no machine paths).
pub fn command_line() -> String {
    std::env::args()
        .map(|a| match a.rsplit_once('/') {
            Some((_, file)) => file.to_owned(),
            None => a,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Now, as `YYYY-MM-DD HH:MM` UTC.
pub fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Cores, CPU model, OS and architecture of this machine.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "{cores} cores ({cpu}), {} {}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// Puts `section` into BENCHMARKS.md between `<!-- NAME: begin -->` and
/// `<!-- NAME: end -->` (appended with its markers when absent); returns
/// the file's path.
pub fn write_section(name: &str, section: &str) -> crate::Result<std::path::PathBuf> {
    let begin = format!("<!-- {name}: begin -->");
    let end = format!("<!-- {name}: end -->");
    let path = crate::workspace_root().join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path)?;
    let block = format!("{begin}\n{section}{end}");
    let new = match (text.find(&begin), text.find(&end)) {
        (Some(a), Some(b)) if a < b => {
            format!("{}{block}{}", &text[..a], &text[b + end.len()..])
        }
        _ => format!("{}\n\n{block}\n", text.trim_end()),
    };
    std::fs::write(&path, new)?;
    Ok(path)
}

/// Cuts the inference benchmarks' `n` texts with `tests/bench/texts.py`
/// into `dir/texts.jsonl` (one `{"text": ...}` per line); returns the file
/// and the texts.
pub fn bench_texts(
    python: &std::path::Path,
    n: u64,
    dir: &std::path::Path,
) -> crate::Result<(std::path::PathBuf, Vec<String>)> {
    let path = dir.join("texts.jsonl");
    let status = std::process::Command::new(python)
        .arg(crate::workspace_root().join("tests/bench/texts.py"))
        .arg(&path)
        .arg(n.to_string())
        .status()?;
    if !status.success() {
        return Err(format!("texts.py failed ({status})").into());
    }
    let texts = std::fs::read_to_string(&path)?
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["text"].as_str().map(str::to_owned))
                .ok_or_else(|| format!("bad line in texts: {l}"))
        })
        .collect::<std::result::Result<_, _>>()?;
    Ok((path, texts))
}

/// The Python of the inference benchmarks: `--python PATH`, else
/// `.tools/bench-venv`'s when it exists, else `python3`.
pub fn bench_python() -> std::path::PathBuf {
    let venv = crate::workspace_root().join(".tools/bench-venv/bin/python");
    arg("--python").map_or_else(
        || match venv.exists() {
            true => venv,
            false => std::path::PathBuf::from("python3"),
        },
        std::path::PathBuf::from,
    )
}

/// Waits until `n` workers report in.
pub fn wait_workers(fleet: &crate::Fleet, n: usize) -> crate::Result<()> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let v: serde_json::Value =
            serde_json::from_str(&fleet.cli(&["worker", "list", "--json"])?)?;
        let up = v
            .as_array()
            .map_or(0, |a| a.iter().filter(|w| w["state"] != "dead").count());
        if up >= n {
            return Ok(());
        }
        if std::time::Instant::now() > until {
            return Err(format!("{up} of {n} workers up after 60 s\n{}", fleet.logs()).into());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Submits the texts as job `job` and waits for it: texts/s from submit to
/// the last shard's `done` event, followed live (as `minions watch` sees
/// it: no polling, which would add its interval and take CPU from the
/// worker). Checks that the job is done and every text has its vector.
pub fn job(
    fleet: &crate::Fleet,
    texts: &std::path::Path,
    n: usize,
    job: &str,
    shard: u64,
    precision: &str,
) -> crate::Result<f64> {
    let rt = tokio::runtime::Runtime::new()?;
    let client = rt.block_on(fleet.client())?;
    let mut watch = rt.block_on(JobWatch::new(&client, job))?;
    let shards = n.div_ceil(shard.max(1) as usize);
    let started = std::time::Instant::now();
    let id = fleet.cli(&[
        "submit",
        "--model",
        "minilm",
        "--input",
        &texts.display().to_string(),
        "--job",
        job,
        "--shard-size",
        &shard.to_string(),
        "--precision",
        precision,
    ])?;
    rt.block_on(watch.all_done(shards, Duration::from_secs(3600)))?;
    let secs = started.elapsed().as_secs_f64();
    let status = fleet.wait_job(&id, Duration::from_secs(60))?;
    if status["state"] != "done" {
        return Err(format!("job {id} ended {status}").into());
    }
    let npy = fleet.dir.path().join(format!("{job}.npy"));
    fleet.cli(&["collect", &id, "--output", &npy.display().to_string()])?;
    let (rows, _, _) = crate::read_npy_f32(&npy)?;
    if rows != n {
        return Err(format!("job {id}: {rows} vectors for {n} texts").into());
    }
    Ok(n as f64 / secs)
}

/// The near no-op model of the dispatch and latency runs.
pub const NOOP: TinySpec = TinySpec {
    hidden: 8,
    layers: 1,
    heads: 1,
    max_len: 16,
};

/// A job's events, followed live from before it is submitted.
pub struct JobWatch {
    sub: async_nats::Subscriber,
    /// Shards done so far.
    pub done: HashSet<u32>,
    /// The latest `done` event's time (ms since the epoch).
    pub last_done_ms: u64,
    /// Starts seen: (shard, worker, attempt, time ms).
    pub started: Vec<(u32, String, u64, u64)>,
}

impl JobWatch {
    /// Subscribes to `job`'s events (before it is submitted).
    pub async fn new(client: &async_nats::Client, job: &str) -> Result<Self> {
        let sub = client
            .subscribe(subjects::job_events(&JobId::new(job)?))
            .await?;
        client.flush().await?;
        Ok(Self {
            sub,
            done: HashSet::new(),
            last_done_ms: 0,
            started: Vec::new(),
        })
    }

    /// Reads the next event, up to `until`.
    pub async fn next(&mut self, until: Instant) -> Result<()> {
        let left = until.saturating_duration_since(Instant::now());
        let m = tokio::time::timeout(left, self.sub.next())
            .await
            .map_err(|_| "timed out waiting for the job's events")?
            .ok_or("event subscription ended")?;
        let e: ShardEvent = decode("shard event", &m.payload, limits::MAX_EVENT_BYTES)?;
        match e.kind {
            EventKind::Done { .. } => {
                self.done.insert(e.shard);
                self.last_done_ms = self.last_done_ms.max(e.at_ms);
            }
            EventKind::Started => {
                self.started
                    .push((e.shard, e.worker.to_string(), e.attempt, e.at_ms));
            }
            _ => {}
        }
        Ok(())
    }

    /// Waits until `shards` shards are done; returns the last done time (ms).
    pub async fn all_done(&mut self, shards: usize, within: Duration) -> Result<u64> {
        let until = Instant::now() + within;
        while self.done.len() < shards {
            self.next(until).await?;
        }
        Ok(self.last_done_ms)
    }

    /// Waits for a start of `shard` by a worker `pred` accepts; returns
    /// (worker, start time ms).
    pub async fn started(
        &mut self,
        shard: u32,
        within: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<(String, u64)> {
        let until = Instant::now() + within;
        loop {
            if let Some((_, w, _, at)) = self
                .started
                .iter()
                .find(|(s, w, _, _)| *s == shard && pred(w))
            {
                return Ok((w.clone(), *at));
            }
            self.next(until).await?;
        }
    }
}

/// Writes `n` records of one short text each.
pub fn write_short(path: &Path, n: usize) -> Result<()> {
    use std::io::Write as _;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for i in 0..n {
        writeln!(f, "{{\"id\":\"r{i}\",\"text\":\"a dog runs {i}\"}}")?;
    }
    f.flush()?;
    Ok(())
}

/// The `done` of a synthetic shard of the watchdog benchmarks' jobs (256
/// records of 384 floats, 9 to 11 s), its output hash derived from `h`.
pub fn bench_done(h: u64) -> minions_schemas::messages::EventKind {
    minions_schemas::messages::EventKind::Done {
        rows: 256,
        output_bytes: 256 * 384 * 4,
        duration_ms: 9_000 + h % 2_000,
        compute_ms: 8_000,
        already_done: false,
        sha256: format!("{:016x}{:048x}", h.wrapping_mul(0x9e37_79b9_7f4a_7c15), h),
        tokens: 0,
        audio_ms: 0,
        made_by: None,
    }
}

/// Writes the spec of a synthetic job `job` of `shards` shards of 256
/// records, model `bench` (the watchdog benchmarks' jobs), into the
/// local-directory store at `store`.
pub fn write_bench_spec(store: &Path, job: &JobId, shards: u32) -> Result<()> {
    let spec = JobSpec {
        submitter: String::new(),
        verify_ppm: None,
        layers: None,
        stage_split: Vec::new(),
        v: SCHEMA_VERSION,
        job: job.clone(),
        model_name: ModelName::new("bench")?,
        model_hash: ModelHash::new("b".repeat(64))?,
        family: ModelFamily::BertEmbedding,
        input: InputDescription {
            source: "bench".into(),
            sha256: String::new(),
            bytes: 0,
            text_field: "text".into(),
            id_field: None,
        },
        shard_size: 256,
        max_batch: 0,
        precision: Precision::F32,
        shards,
        records: u64::from(shards) * 256,
        skipped: 0,
        created_ms: now_ms(),
        team: minions_schemas::messages::DEFAULT_TEAM.to_owned(),
        priority: Default::default(),
        preemptible: false,
        needs: Default::default(),
    };
    let key = store.join(minions_schemas::keys::job_spec(job));
    if let Some(parent) = key.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&key, minions_schemas::encode("job spec", &spec)?)?;
    Ok(())
}

/// A publish's outcome: the stream sequence (or why not) and when it was
/// sent.
type PublishAck = std::pin::Pin<
    Box<dyn std::future::Future<Output = (std::result::Result<u64, String>, Instant)> + Send>,
>;

/// Publishes shard events on their senders' subjects with up to
/// `in_flight` acknowledgements outstanding (async JetStream publishes);
/// with `acked`, records each acknowledged sequence and when it was sent.
pub struct EventPublisher {
    js: async_nats::jetstream::Context,
    in_flight: usize,
    acks: futures::stream::FuturesUnordered<PublishAck>,
    acked: Option<std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u64, Instant>>>>,
    /// Events sent so far.
    pub sent: u64,
}

impl EventPublisher {
    /// A publisher into `js` keeping at most `in_flight` acknowledgements
    /// outstanding; `acked` receives (sequence → send time) of each.
    pub fn new(
        js: async_nats::jetstream::Context,
        in_flight: usize,
        acked: Option<std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u64, Instant>>>>,
    ) -> Self {
        Self {
            js,
            in_flight: in_flight.max(1),
            acks: futures::stream::FuturesUnordered::new(),
            acked,
            sent: 0,
        }
    }

    /// Publishes `e`, first waiting while `in_flight` acknowledgements are
    /// outstanding.
    pub async fn send(&mut self, e: &ShardEvent) -> Result<()> {
        while self.acks.len() >= self.in_flight {
            if let Some((r, at)) = self.acks.next().await {
                self.record(r, at)?;
            }
        }
        let at = Instant::now();
        let ack = self
            .js
            .publish(
                subjects::event(&e.job, e.shard, &e.worker),
                minions_schemas::encode("shard event", e)?.into(),
            )
            .await?;
        self.acks.push(Box::pin(async move {
            let seq = std::future::IntoFuture::into_future(ack)
                .await
                .map(|a| a.sequence);
            (seq.map_err(|e| e.to_string()), at)
        }));
        self.sent += 1;
        Ok(())
    }

    fn record(&mut self, r: std::result::Result<u64, String>, at: Instant) -> Result<()> {
        let seq = r?;
        if let Some(acked) = &self.acked {
            acked
                .lock()
                .unwrap_or_else(|e| panic!("{e}"))
                .insert(seq, at);
        }
        Ok(())
    }

    /// Acknowledgements outstanding.
    pub fn outstanding(&self) -> usize {
        self.acks.len()
    }

    /// Waits for the next acknowledgement (none outstanding: returns at
    /// once).
    pub async fn next_ack(&mut self) -> Result<()> {
        if let Some((r, at)) = self.acks.next().await {
            self.record(r, at)?;
        }
        Ok(())
    }

    /// Waits for every outstanding acknowledgement.
    pub async fn drain(&mut self) -> Result<()> {
        while let Some((r, at)) = self.acks.next().await {
            self.record(r, at)?;
        }
        Ok(())
    }
}
