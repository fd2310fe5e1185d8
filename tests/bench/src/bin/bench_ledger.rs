//! Benchmark: the usage ledger under the events of 1,000 simulated workers,
//! and what it costs the watchdog (and PostgreSQL).
//!
//! Each run starts a fresh nats-server and local-directory store, runs the
//! release `minions-watchdog` (`--listen off`) and simulates `--workers`
//! workers for `--secs` seconds: each runs shards back to back (`--shard-secs`
//! on average, uniform ±50 %), publishing `started` then `done` (1 in 50
//! deliveries handed back part-way and started again by the next free
//! worker), with the energy a worker reports, on its own worker's subject,
//! through async JetStream publishes: about 1,000 events/s. Jobs have 1,000
//! shards; their specs are in the store. The watchdog runs without
//! `--ledger`, then with `--ledger` against a fresh local PostgreSQL, rounds
//! alternating. It measures the watchdog's CPU and peak RSS over the load,
//! PostgreSQL's CPU, the ledger's lag behind the stream every 250 ms, the
//! time the ledger takes to catch up once the load stops, and checks that
//! the ledger holds one `attempts` row per delivery published.
//!
//!   source deploy/tools.sh --test
//!   cargo build --release -p minions-watchdog -p minions-bench --bin minions-watchdog --bin bench_ledger
//!   target/release/bench_ledger [--secs 60] [--rounds 1] [--workers 1000] [--shard-secs 2] [--write]
//!
//! Prints a Markdown section; `--write` puts it into BENCHMARKS.md between
//! `<!-- bench_ledger: begin -->` and `<!-- bench_ledger: end -->`.
//! `--statements` also loads `pg_stat_statements` and prints what the ledger
//! ran, per event, and what one statement costs (a rough profile; the
//! restart and the extension change the figures a little).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use minions_schemas::messages::{Energy, EventKind, ShardEvent};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, SCHEMA_VERSION, WorkerId, streams};
use minions_tests::bench::{
    EventPublisher, LocalSite, command_line, flag, help, machine, num, status_mb, utc_now,
    watchdog_bin, write_bench_spec, write_section,
};
use minions_tests::{PgServer, Proc, Result, out};

const SHARDS_PER_JOB: u32 = 1_000;
/// Publish acknowledgements outstanding at most.
const IN_FLIGHT: usize = 4_096;
/// One delivery in this many is handed back part-way.
const HAND_BACK_EVERY: f64 = 50.0;
/// How often the ledger's cursor is read for its lag.
const POLL: Duration = Duration::from_millis(250);
/// The target for the ledger's lag, seconds.
const LAG_TARGET_SECS: f64 = 5.0;

const USAGE: &str = "\
The usage ledger under 1,000 simulated workers' events: the watchdog's CPU
with --ledger against without, PostgreSQL's CPU, the ledger's lag.

Usage: bench_ledger [--secs S] [--rounds R] [--workers N] [--shard-secs T] [--write]
  (cargo build --release -p minions-watchdog first; source deploy/tools.sh --test)

  --secs S        load per run, seconds (60)
  --rounds R      runs without and with the ledger, alternating (1 each)
  --workers N     simulated workers (1000)
  --shard-secs T  mean time of a shard, seconds, uniform ±50 % (2)
  --watchdog P    the watchdog binary (target/release/minions-watchdog)
  --write         put the section into BENCHMARKS.md
  --statements    also load pg_stat_statements and print what the ledger ran
                  (a rough profile; not for the published figures)
";

/// A small deterministic generator (splitmix64): the load is the same in
/// every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A simulated worker: its identity and how it knows its energy.
struct SimWorker {
    id: WorkerId,
    host: String,
    /// Watts while a shard runs.
    watts: f64,
    measured: bool,
    source: &'static str,
    current: Option<Delivery>,
}

struct Delivery {
    job: JobId,
    shard: u32,
    attempt: u64,
    started: Instant,
    hand_back: bool,
}

/// The fleet: workers, the shards they take, and what was published.
struct Sim {
    rng: Rng,
    workers: Vec<SimWorker>,
    next_shard: u64,
    /// Shards handed back, for the next free worker (job, shard, attempt).
    requeue: VecDeque<(JobId, u32, u64)>,
    jobs: Vec<JobId>,
    store: PathBuf,
    mean_secs: f64,
    started: u64,
    done: u64,
    handed_back: u64,
    joules: f64,
}

impl Sim {
    fn new(workers: u32, mean_secs: f64, store: &Path) -> Result<Self> {
        let mut rng = Rng(0x5eed_1ed9_e4a5_b1c7);
        let workers = (0..workers)
            .map(|i| {
                let host = format!("ws-{i:04}");
                let id = WorkerId::new(format!("{host}-{:06x}", rng.next() & 0xff_ffff))?;
                // Devices and meters as an office fleet has them: most
                // estimate from the device kind (7 W per busy core, 20 W an
                // Apple GPU, 200 W an NVIDIA board); a quarter read RAPL.
                let (watts, measured, source) = match i % 20 {
                    0 => (200.0, false, "estimate"),
                    1..=3 => (20.0, false, "estimate"),
                    4..=8 => (35.0 + f64::from(i % 7) * 4.0, true, "rapl"),
                    9..=14 => (56.0, false, "estimate"),
                    _ => (28.0, false, "estimate"),
                };
                Ok(SimWorker {
                    id,
                    host,
                    watts,
                    measured,
                    source,
                    current: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            rng,
            workers,
            next_shard: 0,
            requeue: VecDeque::new(),
            jobs: Vec::new(),
            store: store.to_owned(),
            mean_secs,
            started: 0,
            done: 0,
            handed_back: 0,
            joules: 0.0,
        })
    }

    /// The next delivery to start: a shard handed back, else a new one (a
    /// new job's spec written when its first shard is taken).
    fn take(&mut self) -> Result<(JobId, u32, u64)> {
        if let Some(d) = self.requeue.pop_front() {
            return Ok(d);
        }
        let n = self.next_shard;
        self.next_shard += 1;
        let (job_no, shard) = (n / u64::from(SHARDS_PER_JOB), n % u64::from(SHARDS_PER_JOB));
        let job_no = usize::try_from(job_no)?;
        if job_no == self.jobs.len() {
            let job = JobId::new(format!("ledger-{job_no:05}"))?;
            write_bench_spec(&self.store, &job, SHARDS_PER_JOB)?;
            self.jobs.push(job);
        }
        let job = self.jobs.get(job_no).ok_or("job out of order")?.clone();
        Ok((job, u32::try_from(shard)?, 1))
    }

    /// Worker `i`'s turn: ends its delivery (done or handed back) and starts
    /// the next; returns when its next turn is due.
    async fn step(&mut self, i: usize, p: &mut EventPublisher) -> Result<Duration> {
        let w = self.workers.get_mut(i).ok_or("no such worker")?;
        if let Some(d) = w.current.take() {
            let ms = u64::try_from(d.started.elapsed().as_millis())?;
            let energy = Energy {
                joules: w.watts * ms as f64 / 1000.0,
                measured: w.measured,
                source: w.source.to_owned(),
            };
            self.joules += energy.joules;
            let kind = if d.hand_back {
                self.handed_back += 1;
                self.requeue
                    .push_back((d.job.clone(), d.shard, d.attempt + 1));
                EventKind::HandedBack {
                    reason: "owner: input 0 s ago".into(),
                }
            } else {
                self.done += 1;
                let h = (self.next_shard << 20) ^ u64::from(d.shard) ^ (d.attempt << 40);
                EventKind::Done {
                    rows: 256,
                    output_bytes: 256 * 384 * 4,
                    duration_ms: ms,
                    compute_ms: ms * 9 / 10,
                    already_done: false,
                    sha256: format!("{:016x}{:048x}", h.wrapping_mul(0x9e37_79b9_7f4a_7c15), h),
                    tokens: 0,
                    audio_ms: 0,
                    made_by: None,
                }
            };
            p.send(&event(w, &d, kind, Some(energy))).await?;
        }
        let (job, shard, attempt) = self.take()?;
        let hand_back = self.rng.unit() * HAND_BACK_EVERY < 1.0;
        let mut secs = self.mean_secs * (0.5 + self.rng.unit());
        if hand_back {
            secs *= 0.2 + 0.6 * self.rng.unit();
        }
        let d = Delivery {
            job,
            shard,
            attempt,
            started: Instant::now(),
            hand_back,
        };
        let w = self.workers.get_mut(i).ok_or("no such worker")?;
        p.send(&event(w, &d, EventKind::Started, None)).await?;
        w.current = Some(d);
        self.started += 1;
        Ok(Duration::from_secs_f64(secs))
    }
}

fn event(w: &SimWorker, d: &Delivery, kind: EventKind, energy: Option<Energy>) -> ShardEvent {
    ShardEvent {
        v: SCHEMA_VERSION,
        job: d.job.clone(),
        shard: d.shard,
        worker: w.id.clone(),
        host: w.host.clone(),
        attempt: d.attempt,
        at_ms: now_ms(),
        kind,
        energy,
    }
}

/// Stream sequence → when its event was sent, for events the ledger has
/// not applied yet (as far as the lag poller knows).
type Unapplied = Arc<Mutex<BTreeMap<u64, Instant>>>;

/// Runs the fleet for `secs`; returns the load's wall time.
async fn load(p: &mut EventPublisher, sim: &mut Sim, secs: f64) -> Result<Duration> {
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(secs);
    let mut due: BinaryHeap<Reverse<(Instant, usize)>> = BinaryHeap::new();
    for i in 0..sim.workers.len() {
        let first = Duration::from_secs_f64(sim.mean_secs * sim.rng.unit());
        due.push(Reverse((t0 + first, i)));
    }
    while let Some(&Reverse((next, _))) = due.peek() {
        if next >= end {
            tokio::time::sleep_until(end.into()).await;
            break;
        }
        tokio::select! {
            biased;
            r = p.next_ack(), if p.outstanding() > 0 => r?,
            _ = tokio::time::sleep_until(next.into()) => {
                let now = Instant::now();
                while let Some(&Reverse((t, i))) = due.peek() {
                    if t > now || t >= end {
                        break;
                    }
                    due.pop();
                    let after = sim.step(i, p).await?;
                    due.push(Reverse((Instant::now() + after, i)));
                }
            }
        }
    }
    let wall = t0.elapsed();
    p.drain().await?;
    Ok(wall)
}

/// (parent pid, own CPU seconds, waited-for children's CPU seconds) of
/// process `pid`, from `/proc/PID/stat`.
fn proc_stat(pid: u32) -> Option<(u32, f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit(')').next()?;
    let f: Vec<&str> = after.split_whitespace().collect();
    // After the name: state [0], ppid [1]; utime [11], stime [12], cutime
    // [13], cstime [14], in clock ticks.
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |v| v as f64);
    Some((
        f.get(1)?.parse().ok()?,
        (tick(11)? + tick(12)?) / tck,
        (tick(13)? + tick(14)?) / tck,
    ))
}

/// CPU seconds of PostgreSQL: the postmaster, the children it reaped
/// (autovacuum workers come and go), and its live children (backends,
/// background writer, WAL writer...) except `skip` (the bench's own
/// connection).
fn pg_cpu(postmaster: u32, skip: u32) -> Result<f64> {
    let (_, own, reaped) = proc_stat(postmaster).ok_or("PostgreSQL is not running")?;
    let mut total = own + reaped;
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == skip {
            continue;
        }
        if let Some((ppid, cpu, _)) = proc_stat(pid)
            && ppid == postmaster
        {
            total += cpu;
        }
    }
    Ok(total)
}

fn own_cpu(pid: u32) -> Result<f64> {
    Ok(proc_stat(pid)
        .ok_or_else(|| format!("process {pid} is not running"))?
        .1)
}

/// CPU seconds the whole machine has been busy (all cores), from
/// `/proc/stat`.
fn machine_busy() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let f: Vec<f64> = stat
        .lines()
        .next()
        .ok_or("empty /proc/stat")?
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    // user, nice, system, (idle, iowait,) irq, softirq; steal and guest
    // left out (guest time is in user time already).
    let busy: f64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| f.get(i)).sum();
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.map_or(100.0, |v| v as f64);
    Ok(busy / tck)
}

/// Waits for a line holding `needle` in `log`.
fn wait_line(p: &Proc, needle: &str, within: Duration) -> Result<()> {
    let until = Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(&p.log).unwrap_or_default();
        if text.contains(needle) {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!(
                "no {needle:?} from {} within {within:?}:\n{}",
                p.name,
                p.log_tail(30)
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What one run measured.
struct Run {
    ledger: bool,
    /// Cores the rest of the machine kept busy during the load (not the
    /// watchdog, PostgreSQL, nats-server or the bench).
    others: f64,
    events: u64,
    wall: f64,
    /// Watchdog CPU seconds per wall second.
    cpu: f64,
    rss_mb: f64,
    ledger_figures: Option<LedgerFigures>,
}

struct LedgerFigures {
    pg_cpu: f64,
    /// Ledger transactions per second (PostgreSQL's commits, less the
    /// bench's own queries).
    tx_per_s: f64,
    lag_p99: f64,
    lag_max: f64,
    /// The largest lag in each 5 s of the load.
    lag_by_5s: Vec<f64>,
    catch_up: f64,
    attempts: i64,
    deliveries: u64,
    done_rows: i64,
    done_events: u64,
    joules_ledger: f64,
    joules_sent: f64,
}

/// The ledger's cursor (0 before the watchdog made one).
async fn cursor(db: &tokio_postgres::Client) -> Result<u64> {
    let row = db
        .query_one(
            "SELECT coalesce(max(seq), 0)::bigint FROM ledger_cursor",
            &[],
        )
        .await?;
    Ok(u64::try_from(row.get::<_, i64>(0))?)
}

/// Every [`POLL`], the ledger's lag: how long ago the oldest event past its
/// cursor was sent (0 when it holds every acknowledged event).
async fn poll_lag(
    db: Arc<tokio_postgres::Client>,
    unapplied: Unapplied,
    stop: Arc<AtomicBool>,
    queries: Arc<AtomicU64>,
) -> Result<Vec<f64>> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(POLL);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let seq = cursor(&db).await?;
        queries.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut map = unapplied.lock().unwrap_or_else(|e| panic!("{e}"));
        let rest = map.split_off(&(seq + 1));
        *map = rest;
        samples.push(map.first_key_value().map_or(0.0, |(_, at)| {
            now.saturating_duration_since(*at).as_secs_f64()
        }));
    }
    Ok(samples)
}

async fn commits(db: &tokio_postgres::Client) -> Result<i64> {
    // Statistics reach the view at most once a second; clear this
    // backend's snapshot so that each read sees the latest.
    db.execute("SELECT pg_stat_clear_snapshot()", &[]).await?;
    let row = db
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?;
    Ok(row.get::<_, i64>(0))
}

/// Loads `pg_stat_statements` (a restart) for `--statements`.
async fn statements_on(pg: &mut PgServer) -> Result<()> {
    let (db, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    db.batch_execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        .await?;
    drop(db);
    pg.stop()?;
    pg.start_again()?;
    let (db, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    db.batch_execute("CREATE EXTENSION pg_stat_statements")
        .await?;
    // What one statement costs the ledger's writer as it sends them: one
    // at a time, each prepared then executed (a query string), against a
    // statement prepared once.
    let n = 2_000u32;
    let t = Instant::now();
    for _ in 0..n {
        db.execute("SELECT 1", &[]).await?;
    }
    let text = t.elapsed() / n;
    let one = db.prepare("SELECT 1").await?;
    let t = Instant::now();
    for _ in 0..n {
        db.execute(&one, &[]).await?;
    }
    let prepared = t.elapsed() / n;
    out!(
        "one statement at a time, before the load: {:.0} µs as a query string, {:.0} µs prepared once",
        text.as_secs_f64() * 1e6,
        prepared.as_secs_f64() * 1e6
    );
    Ok(())
}

/// Prints what PostgreSQL ran for the ledger (`--statements`): statements
/// per event and their execution time, against the `secs` from the start
/// of the load until the ledger caught up.
async fn statements(db: &tokio_postgres::Client, events: u64, secs: f64) -> Result<()> {
    let rows = db
        .query(
            "SELECT calls, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 90)
               FROM pg_stat_statements
              WHERE query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%max(seq)%'
                AND query NOT ILIKE '%pg_backend_pid%'
              ORDER BY calls DESC",
            &[],
        )
        .await?;
    let (mut calls, mut ms) = (0i64, 0f64);
    out!("statements run for the ledger ({events} events, {secs:.1} s):");
    for r in &rows {
        let (c, t, q): (i64, f64, String) = (r.get(0), r.get(1), r.get(2));
        calls += c;
        ms += t;
        out!(
            "  {:>8} calls {:>5.2}/event {:>7.0} ms ({:>5.1} µs each)  {q}",
            c,
            c as f64 / events.max(1) as f64,
            t,
            1000.0 * t / c.max(1) as f64
        );
    }
    out!(
        "  total {calls} statements, {:.2} per event, {:.0}/s; executing {:.1} s of {secs:.1} s ({:.0} µs each)",
        calls as f64 / events.max(1) as f64,
        calls as f64 / secs,
        ms / 1000.0,
        1000.0 * ms / calls.max(1) as f64
    );
    Ok(())
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((p * s.len() as f64).ceil() as usize).saturating_sub(1);
    s.get(i).copied().unwrap_or(0.0)
}

/// One run: a fresh site, the watchdog (with a fresh PostgreSQL when
/// `ledger`), the load, the figures.
async fn run(
    ledger: bool,
    name: &str,
    workers: u32,
    secs: f64,
    mean_secs: f64,
    watchdog: &Path,
) -> Result<Run> {
    let LocalSite {
        js,
        store_url,
        store,
        nats,
        dir,
        ..
    } = LocalSite::start("minions-bench-ledger-").await?;
    let pg = if ledger {
        let mut pg = PgServer::start()?;
        if flag("--statements") {
            statements_on(&mut pg).await?;
        }
        Some(pg)
    } else {
        None
    };
    let mut args: Vec<String> = vec![
        "--nats".into(),
        nats.url(),
        "--store".into(),
        store_url,
        "--listen".into(),
        "off".into(),
        "--name".into(),
        name.into(),
        // Its events are synthetic: no outputs to check.
        "--unchecked-results".into(),
    ];
    if let Some(pg) = &pg {
        args.extend(["--ledger".into(), pg.url()]);
    }
    let envs = [
        ("RUST_LOG".to_owned(), "info".to_owned()),
        // No settings file of this machine's (it could name a ledger).
        (
            "XDG_CONFIG_HOME".to_owned(),
            dir.path().display().to_string(),
        ),
    ];
    let wd = Proc::spawn(name, watchdog, &args, &envs, dir.path())?;
    let wd_pid = u32::try_from(wd.pid())?;
    wait_line(&wd, "watchdog started", Duration::from_secs(60))?;
    let mut db_conn = None;
    if let Some(pg) = &pg {
        wait_line(&wd, "ledger connected", Duration::from_secs(60))?;
        let (client, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let own: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let postmaster = pg.pg.pid().ok_or("PostgreSQL has no pid")?;
        db_conn = Some((Arc::new(client), u32::try_from(own)?, postmaster));
    }
    // Let the start settle.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let unapplied: Unapplied = Arc::default();
    let mut p = EventPublisher::new(js.clone(), IN_FLIGHT, Some(unapplied.clone()));
    let mut sim = Sim::new(workers, mean_secs, &store)?;
    let stop = Arc::new(AtomicBool::new(false));
    let queries = Arc::new(AtomicU64::new(0));
    let mut before = (0.0, 0);
    let poller = match &db_conn {
        Some((db, own, postmaster)) => {
            before = (pg_cpu(*postmaster, *own)?, commits(db).await?);
            Some(tokio::spawn(poll_lag(
                db.clone(),
                unapplied.clone(),
                stop.clone(),
                queries.clone(),
            )))
        }
        None => None,
    };
    let (nats_pid, me) = (u32::try_from(nats.proc.pid())?, std::process::id());
    let cpu0 = own_cpu(wd_pid)?;
    let t_load = Instant::now();
    let rest0 = machine_busy()? - own_cpu(nats_pid)? - own_cpu(me)?;
    let wall = load(&mut p, &mut sim, secs).await?;
    let wd_secs = own_cpu(wd_pid)? - cpu0;
    let rest = machine_busy()? - own_cpu(nats_pid)? - own_cpu(me)? - rest0 - wd_secs;
    let cpu = wd_secs / wall.as_secs_f64();
    let mut pg_secs = 0.0;
    let rss_mb = status_mb(wd_pid, "VmHWM:")?;
    let mut figures = None;
    if let (Some((db, own, postmaster)), Some(poller)) = (&db_conn, poller) {
        pg_secs = pg_cpu(*postmaster, *own)? - before.0;
        let commits_after = commits(db).await?;
        stop.store(true, Ordering::Relaxed);
        let lags = poller.await??;
        // Our own: the poller's queries and the statistics reads (two
        // statements each).
        let own_tx = i64::try_from(queries.load(Ordering::Relaxed))? + 3;
        let tx = (commits_after - before.1 - own_tx).max(0);
        let ended = Instant::now();
        let last = js
            .get_stream(streams::EVENTS_STREAM)
            .await?
            .info()
            .await?
            .state
            .last_sequence;
        while cursor(db).await? < last {
            if ended.elapsed() > Duration::from_secs(600) {
                return Err(format!(
                    "the ledger did not catch up within 600 s:\n{}",
                    wd.log_tail(30)
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The load ended `wall` after it began; the drain took a moment.
        let catch_up = ended.elapsed().as_secs_f64();
        if flag("--statements") {
            statements(db, p.sent, t_load.elapsed().as_secs_f64()).await?;
        }
        let row = db
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE outcome = 'done'),
                        coalesce(sum(energy_j), 0)::float8 FROM attempts",
                &[],
            )
            .await?;
        figures = Some(LedgerFigures {
            pg_cpu: pg_secs / wall.as_secs_f64(),
            tx_per_s: tx as f64 / wall.as_secs_f64(),
            lag_p99: percentile(&lags, 0.99),
            lag_max: lags.iter().copied().fold(0.0, f64::max),
            lag_by_5s: lags
                .chunks(20)
                .map(|c| c.iter().copied().fold(0.0, f64::max))
                .collect(),
            catch_up,
            attempts: row.get(0),
            deliveries: sim.started,
            done_rows: row.get(1),
            done_events: sim.done,
            joules_ledger: row.get(2),
            joules_sent: sim.joules,
        });
    }
    // What went wrong on the way, if anything (a ledger that reconnected
    // reads again from its cursor).
    let log = std::fs::read_to_string(&wd.log).unwrap_or_default();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    if !warnings.is_empty() {
        out!("{name}: {} warnings in its log:", warnings.len());
        for l in warnings.iter().take(5) {
            out!("  {l}");
        }
    }
    drop(wd);
    drop(pg);
    drop(nats);
    drop(dir);
    Ok(Run {
        ledger,
        others: (rest - pg_secs).max(0.0) / wall.as_secs_f64(),
        events: p.sent,
        wall: wall.as_secs_f64(),
        cpu,
        rss_mb,
        ledger_figures: figures,
    })
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let secs = num("--secs", 60)? as f64;
    let rounds = num("--rounds", 1)?;
    let workers = u32::try_from(num("--workers", 1000)?)?;
    let mean_secs: f64 =
        minions_tests::bench::arg("--shard-secs").map_or(Ok(2.0), |v| v.parse())?;
    let watchdog = watchdog_bin()?;
    let load_before = loadavg();
    let date = utc_now();
    out!(
        "{date} · {} · {} · load average {load_before}",
        machine(),
        watchdog.display()
    );
    let mut runs = Vec::new();
    for r in 1..=rounds {
        for ledger in [false, true] {
            let name = format!("wd-{}-{r}", if ledger { "ledger" } else { "plain" });
            let x = run(ledger, &name, workers, secs, mean_secs, &watchdog).await?;
            out!(
                "round {r} {}: {:.0} events/s, watchdog CPU {:.1} %, peak RSS {:.0} MB, other processes {:.2} cores{}",
                if ledger { "with the ledger" } else { "without" },
                x.events as f64 / x.wall,
                x.cpu * 100.0,
                x.rss_mb,
                x.others,
                x.ledger_figures.as_ref().map_or(String::new(), |f| format!(
                    ", PostgreSQL CPU {:.1} %, {:.0} ledger tx/s, lag p99 {:.2} s max {:.2} s, caught up {:.2} s after the load, attempts {} / {} published, done {} / {}, energy {:.0} / {:.0} J; largest lag in each 5 s: {}",
                    f.pg_cpu * 100.0,
                    f.tx_per_s,
                    f.lag_p99,
                    f.lag_max,
                    f.catch_up,
                    f.attempts,
                    f.deliveries,
                    f.done_rows,
                    f.done_events,
                    f.joules_ledger,
                    f.joules_sent,
                    f.lag_by_5s
                        .iter()
                        .map(|l| format!("{l:.1}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                ))
            );
            runs.push((r, x));
        }
    }

    let dash = "—";
    let mut rows = Vec::new();
    let mut bad = Vec::new();
    for (r, x) in &runs {
        let f = x.ledger_figures.as_ref();
        let cell = |s: Option<String>| s.unwrap_or_else(|| dash.to_owned());
        rows.push(format!(
            "| {r} | {} | {:.0} | {:.1} | {:.0} | {} | {} | {} | {} | {} | {:.2} |",
            if x.ledger {
                "with `--ledger`"
            } else {
                "without"
            },
            x.events as f64 / x.wall,
            x.cpu * 100.0,
            x.rss_mb,
            cell(f.map(|f| format!("{:.1}", f.pg_cpu * 100.0))),
            cell(f.map(|f| format!("{:.0}", f.tx_per_s))),
            cell(f.map(|f| format!("{:.2} / {:.2}", f.lag_p99, f.lag_max))),
            cell(f.map(|f| format!("{:.2}", f.catch_up))),
            cell(f.map(|f| format!("{} / {}", f.attempts, f.deliveries))),
            x.others,
        ));
        if let Some(f) = f
            && (u64::try_from(f.attempts).ok() != Some(f.deliveries)
                || u64::try_from(f.done_rows).ok() != Some(f.done_events)
                || (f.joules_ledger - f.joules_sent).abs() > 1e-6 * f.joules_sent.max(1.0))
        {
            bad.push(format!(
                "round {r}: the ledger holds {} attempts ({} done, {:.1} J) for {} deliveries ({} done, {:.1} J) published",
                f.attempts, f.done_rows, f.joules_ledger, f.deliveries, f.done_events, f.joules_sent
            ));
        }
    }
    let cpu_of = |ledger: bool| {
        mean(
            &runs
                .iter()
                .filter(|(_, x)| x.ledger == ledger)
                .map(|(_, x)| x.cpu * 100.0)
                .collect::<Vec<_>>(),
        )
    };
    let figures: Vec<&LedgerFigures> = runs
        .iter()
        .filter_map(|(_, x)| x.ledger_figures.as_ref())
        .collect();
    let (without, with) = (cpu_of(false), cpu_of(true));
    let pg = mean(&figures.iter().map(|f| f.pg_cpu * 100.0).collect::<Vec<_>>());
    let lag_max = figures.iter().map(|f| f.lag_max).fold(0.0, f64::max);
    let rate = mean(
        &runs
            .iter()
            .map(|(_, x)| x.events as f64 / x.wall)
            .collect::<Vec<_>>(),
    );
    let doc = format!(
        "## Usage ledger: 1,000 simulated workers' events, watchdog with and without the ledger\n\n\
         Made by `source deploy/tools.sh --test && cargo build --release -p minions-watchdog \
         -p minions-bench --bin minions-watchdog --bin bench_ledger && target/release/{}` \
         on {date} UTC, {}; load average {load_before} before it.\n\n\
         {workers} simulated workers run shards back to back, {mean_secs} s each on average \
         (uniform ±50 %), for {secs:.0} s; each delivery publishes `started` and then `done` \
         with its energy as a worker reports it (three quarters estimated from the device \
         kind, a quarter read from RAPL); 1 in 50 is handed back part-way and started again \
         by the next free worker. Every event goes on its own worker's subject, through \
         async JetStream publishes into a fresh nats-server: about {rate:.0} events/s, jobs \
         of 1,000 shards whose specs are in a local-directory store. The release watchdog \
         (`--listen off`) runs without `--ledger`, then with `--ledger` against a fresh local \
         PostgreSQL (fsync off, as the tests run it), {rounds} round(s) of each, alternating. \
         CPU is user + system time from `/proc` over the load, as % of one core; \
         PostgreSQL's is its postmaster's, its background processes' and the watchdog's \
         backend's (the bench's own connection left out); ledger tx/s are its commits. \
         Lag, read every 250 ms: how long ago the oldest event past the ledger's cursor was \
         published (0 when the cursor holds every acknowledged event); target under \
         {LAG_TARGET_SECS:.0} s. Caught up: from the end of the load until the cursor reaches \
         the stream's last sequence. `attempts / deliveries` checks the ledger: its \
         `attempts` rows against deliveries published (done rows and joules are checked \
         too). Other load: cores the rest of the machine kept busy meanwhile (`/proc/stat` \
         less the watchdog, PostgreSQL, nats-server and the bench), the noise on the \
         figures.\n\n\
         | round | watchdog | events/s | watchdog CPU % | watchdog peak RSS MB | PostgreSQL CPU % | ledger tx/s | lag p99 / max s | caught up after s | attempts / deliveries | other load, cores |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n{}\n\n\
         Mean watchdog CPU: **{without:.1} %** of a core without the ledger, **{with:.1} %** \
         with it ({:.2}×), plus **{pg:.1} %** in PostgreSQL. The ledger's lag reached \
         **{lag_max:.2} s** at most: the target of under {LAG_TARGET_SECS:.0} s is {}.\n\n",
        command_line(),
        machine(),
        rows.join("\n"),
        with / without.max(1e-9),
        if lag_max < LAG_TARGET_SECS {
            "met"
        } else {
            "missed"
        },
    );
    out!("\n{doc}");
    if !bad.is_empty() {
        return Err(bad.join("\n").into());
    }
    if flag("--write") {
        let p = write_section("bench_ledger", &doc)?;
        out!("written to {}", p.display());
    }
    Ok(())
}
