//! Benchmark: does the watchdog's state stay bounded by open work over a
//! fleet's months? Feeds synthetic shard events through the watchdog's
//! tracker and view (the code `minions-watchdog` folds the events stream
//! with, in this process, without NATS, so that 100 million events take
//! minutes): first the `started` events of `--open-jobs` jobs of 1,000
//! shards that never finish (50,000 open shards by default), then jobs of
//! 1,000 shards that finish one after another (each shard `started` then
//! `done`, one in 30 handed back and started again first). Each finished
//! job's manifest is written to a local-directory store, as the watchdog
//! writes it; the job's folder is then removed (collected), so that the
//! disk holds one job at a time.
//!
//! At each of `--at` (events fed) it prints the process's RSS and peak
//! RSS, the checkpoint's size, the time to copy the state (the only part
//! that holds the view's lock; the copy is encoded and written beside the
//! fold), to encode it, and the time a restarted watchdog takes to decode
//! and restore it.
//!
//!   cargo run --release -p minions-bench --bin bench_watchdog_state -- \
//!     --at 1000000,10000000,50000000,100000000
//!
//! Prints a Markdown table (for BENCHMARKS.md).

use std::sync::Arc;
use std::time::Instant;

use minions_schemas::messages::{EventKind, ShardEvent};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, SCHEMA_VERSION, WorkerId};
use minions_tests::bench::{
    bench_done, help, list, machine, num, status_mb, utc_now, write_bench_spec,
};
use minions_tests::{Result, out};
use minions_watchdog::checkpoint::{self, FORMAT, Header};
use minions_watchdog::registry::Registry;
use minions_watchdog::tracker::{DEFAULT_FINISHED_KEPT, Tracker};
use minions_watchdog::view::View;
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;

const USAGE: &str = "
bench_watchdog_state: the watchdog's memory and checkpoint as events of
finished jobs pile up.

  --at N,N,...       events fed at which to measure (default 1000000,10000000,50000000,100000000)
  --open-jobs N      jobs of 1,000 shards left running (default 50: 50,000 open shards)
  --finished-kept N  finished jobs whose summary is kept (default the watchdog's)
";

const SHARDS_PER_JOB: u32 = 1_000;
const WORKERS: u32 = 300;

/// Feeds synthetic events into a tracker: job numbers, a clock, a count.
struct Feeder {
    tracker: Tracker,
    store: std::path::PathBuf,
    fed: u64,
    job_no: u32,
    t0: u64,
}

impl Feeder {
    fn event(&self, job: &JobId, shard: u32, attempt: u64, kind: EventKind) -> Result<ShardEvent> {
        let w = (self.job_no * 7 + shard) % WORKERS;
        Ok(ShardEvent {
            energy: None,
            v: SCHEMA_VERSION,
            job: job.clone(),
            shard,
            worker: WorkerId::new(format!("mac-{w:04}-1a2b3c"))?,
            host: format!("mac-{w:04}"),
            attempt,
            at_ms: self.t0 + self.fed,
            kind,
        })
    }

    async fn feed(&mut self, e: ShardEvent) {
        self.tracker.apply(e).await;
        self.fed += 1;
    }

    /// A job of 1,000 shards, each started and left running.
    async fn open_job(&mut self) -> Result<()> {
        let job = JobId::new(format!("open-{:06}", self.job_no))?;
        write_bench_spec(&self.store, &job, SHARDS_PER_JOB)?;
        for shard in 0..SHARDS_PER_JOB {
            let e = self.event(&job, shard, 1, EventKind::Started)?;
            self.feed(e).await;
        }
        self.job_no += 1;
        Ok(())
    }

    /// A job of 1,000 shards that runs to the end; its folder is removed
    /// once its manifest is written.
    async fn finished_job(&mut self) -> Result<()> {
        let job = JobId::new(format!("done-{:06}", self.job_no))?;
        write_bench_spec(&self.store, &job, SHARDS_PER_JOB)?;
        for shard in 0..SHARDS_PER_JOB {
            let e = self.event(&job, shard, 1, EventKind::Started)?;
            self.feed(e).await;
            let mut attempt = 1;
            if shard % 30 == 7 {
                let reason = "owner: input 0 s ago".to_owned();
                let e = self.event(&job, shard, 1, EventKind::HandedBack { reason })?;
                self.feed(e).await;
                attempt = 2;
                let e = self.event(&job, shard, 2, EventKind::Started)?;
                self.feed(e).await;
            }
            let h = u64::from(self.job_no) << 32 | u64::from(shard);
            let done = bench_done(h);
            let e = self.event(&job, shard, attempt, done)?;
            self.feed(e).await;
        }
        let folder = self.store.join("jobs").join(job.as_str());
        if !folder.join("manifest.msgpack").exists() {
            return Err(format!("job {job} finished but no manifest was written").into());
        }
        std::fs::remove_dir_all(&folder)?;
        self.job_no += 1;
        Ok(())
    }
}

/// One measurement.
struct Row {
    events: u64,
    finished_jobs: u32,
    secs: f64,
    rss_mb: f64,
    peak_mb: f64,
    checkpoint_mb: f64,
    copy_ms: f64,
    encode_ms: f64,
    restore_ms: f64,
}

/// Copies the tracker's state (the only part that holds the view's lock),
/// encodes it as a checkpoint and restores that into a fresh tracker, as a
/// restarted watchdog would: (bytes, copy ms, encode ms, restore ms).
fn checkpoint_round(
    tracker: &Tracker,
    store: Arc<dyn ObjectStore>,
) -> Result<(usize, f64, f64, f64)> {
    let header = Header {
        v: SCHEMA_VERSION,
        format: FORMAT,
        readable_from: Some(checkpoint::READABLE_FROM),
        seq: 1,
        stream_created: "bench".into(),
        written_ms: now_ms(),
        writer: "bench".into(),
    };
    let t = Instant::now();
    let snapshot = checkpoint::Snapshot::of(tracker);
    let copy_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let bytes = snapshot.encode(&header)?;
    let encode_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let cp = checkpoint::decode_checkpoint(&bytes)?;
    let view = Arc::new(View::new("restored".into(), Registry::new(3)));
    let mut fresh = Tracker::standalone(store, view, DEFAULT_FINISHED_KEPT);
    fresh.restore(cp.body.tracker, cp.body.view)?;
    let restore_ms = t.elapsed().as_secs_f64() * 1000.0;
    Ok((bytes.len(), copy_ms, encode_ms, restore_ms))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    if help(USAGE) {
        return Ok(());
    }
    let at: Vec<u64> = list("--at", "1000000,10000000,50000000,100000000")?;
    let open_jobs = num("--open-jobs", 50)?;
    let kept = usize::try_from(num("--finished-kept", DEFAULT_FINISHED_KEPT as u64)?)?;
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("store");
    std::fs::create_dir_all(&root)?;
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&root)?);
    let view = Arc::new(View::new("bench".into(), Registry::new(3)));
    let mut f = Feeder {
        tracker: Tracker::standalone(store.clone(), view, kept),
        store: root.clone(),
        fed: 0,
        job_no: 0,
        t0: now_ms(),
    };
    let began = Instant::now();
    for _ in 0..open_jobs {
        f.open_job().await?;
    }
    let mut rows = Vec::new();
    let first_finished = f.job_no;
    for &until in &at {
        while f.fed < until {
            f.finished_job().await?;
        }
        let pid = std::process::id();
        let (bytes, copy_ms, encode_ms, restore_ms) = checkpoint_round(&f.tracker, store.clone())?;
        let row = Row {
            events: f.fed,
            finished_jobs: f.job_no - first_finished,
            secs: began.elapsed().as_secs_f64(),
            rss_mb: status_mb(pid, "VmRSS:")?,
            peak_mb: status_mb(pid, "VmHWM:")?,
            checkpoint_mb: bytes as f64 / 1e6,
            copy_ms,
            encode_ms,
            restore_ms,
        };
        eprintln!(
            "{} events ({} jobs finished) in {:.0} s: RSS {:.0} MB (peak {:.0}), checkpoint {:.2} MB (copy {:.1} ms, encode {:.0} ms, restore {:.0} ms)",
            row.events,
            row.finished_jobs,
            row.secs,
            row.rss_mb,
            row.peak_mb,
            row.checkpoint_mb,
            row.copy_ms,
            row.encode_ms,
            row.restore_ms
        );
        rows.push(row);
    }
    print_table(&rows, open_jobs, kept);
    Ok(())
}

fn print_table(rows: &[Row], open_jobs: u64, kept: usize) {
    out!(
        "Run on {}, {}; {} open shards ({open_jobs} jobs of {SHARDS_PER_JOB} left running), finished jobs of {SHARDS_PER_JOB} shards, {kept} finished summaries kept.\n",
        utc_now(),
        machine(),
        open_jobs * u64::from(SHARDS_PER_JOB)
    );
    out!(
        "| events fed | jobs finished | s | RSS MB | peak RSS MB | checkpoint MB | copy ms (view locked) | encode ms | restore ms |"
    );
    out!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        out!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} | {:.0} | {:.0} |",
            r.events,
            r.finished_jobs,
            r.secs,
            r.rss_mb,
            r.peak_mb,
            r.checkpoint_mb,
            r.copy_ms,
            r.encode_ms,
            r.restore_ms
        );
    }
}
