//! Whole scenarios more than one test runs: a slow shard on a fleet's first
//! worker and that worker killed under it, and the core-path job.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::{Fleet, Result, max_abs_diff, read_npy_f32, tiny_model, write_corpus};

impl Fleet {
    /// Pushes [`crate::SLOW`] as `slow`, writes 500 records, starts `watchdogs`
    /// watchdogs and a one-slot worker (`first_flags` appended), submits the
    /// records as the one shard of job `job`, waits (60 s) until that worker
    /// starts it, then adds a second one-slot worker beside it.
    pub async fn slow_shard_on_first_worker(
        &mut self,
        job: &str,
        watchdogs: usize,
        first_flags: &[&str],
    ) -> Result<SlowShard> {
        let model = self.push_slow_model()?;
        let input = self.dir.path().join("in.jsonl");
        let texts = write_corpus(&input, 500)?;
        for _ in 0..watchdogs {
            self.add_watchdog(&[])?;
        }
        let mut flags = vec!["--slots", "1"];
        flags.extend_from_slice(first_flags);
        self.add_worker(&flags)?;
        let job = self.submit("slow", &input, 500, job)?;
        let (first, _) = self
            .wait_started(&job, 0, Duration::from_secs(60), |_| true)
            .await?;
        self.add_worker(&["--slots", "1"])?;
        Ok(SlowShard {
            job,
            model,
            texts,
            first,
        })
    }

    /// SIGKILLs the first worker and waits (30 s) until shard 0 of `job`
    /// starts on the second (`w2`); returns that worker's id and the time
    /// from the kill to that start.
    pub async fn kill_first_worker(&mut self, job: &str) -> Result<(String, Duration)> {
        let killed_at = Instant::now();
        self.workers[0].signal(nix::sys::signal::Signal::SIGKILL)?;
        let (second, seen) = self
            .wait_started(job, 0, Duration::from_secs(30), |w| w.starts_with("w2-"))
            .await?;
        Ok((second, seen.duration_since(killed_at)))
    }

    /// The worker-kill scenario: a [`Fleet::slow_shard_on_first_worker`]
    /// job `job` with `watchdogs` watchdogs whose first worker has a 60 s ack
    /// wait; 2 s after the second worker joins, the first is SIGKILLed.
    /// Prints (after `label`) how long until the shard ran on the second
    /// worker and asserts it took at most 4 s, well inside the ack wait: the
    /// watchdog handed it back.
    pub async fn worker_failover(
        &mut self,
        job: &str,
        watchdogs: usize,
        label: &str,
    ) -> Result<SlowShard> {
        let shard = self
            .slow_shard_on_first_worker(job, watchdogs, &["--ack-wait-secs", "60"])
            .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (second, failover) = self.kill_first_worker(&shard.job).await?;
        eprintln!(
            "{label}SIGKILL of {} -> shard running on {second} after {:.2} s (ack wait 60 s)",
            shard.first,
            failover.as_secs_f64()
        );
        assert!(
            failover <= Duration::from_secs(4),
            "failover took {failover:?}"
        );
        Ok(shard)
    }
}

/// A one-shard job of the [`crate::SLOW`] model running on a fleet's first worker
/// (see [`Fleet::slow_shard_on_first_worker`]).
pub struct SlowShard {
    /// The job id.
    pub job: String,
    /// The model's folder.
    pub model: PathBuf,
    /// The job's records.
    pub texts: Vec<String>,
    /// The id of the worker that started the shard.
    pub first: String,
}

/// The core-path acceptance scenario, on any store: a 10,000-record job with
/// shard size 100 on 2 workers completes; `collect` returns 10,000 vectors
/// in input order, each equal (≤ 1e-5) to the in-process result of the same
/// model code; the work stream ends empty; re-submitting the same job id
/// publishes nothing.
pub async fn core_job_scenario(fleet: &mut Fleet) -> Result<()> {
    let model_dir = tiny_model(fleet.dir.path(), "tiny")?;
    let hash = fleet.cli(&[
        "model",
        "push",
        &model_dir.display().to_string(),
        "--name",
        "tiny",
    ])?;
    assert_eq!(hash.len(), 64, "model push prints the hash: {hash}");
    let input = fleet.dir.path().join("input.jsonl");
    let texts = write_corpus(&input, 10_000)?;
    fleet.add_worker(&[])?;
    fleet.add_worker(&[])?;
    let started = Instant::now();
    let job = fleet.cli(&[
        "submit",
        "--model",
        "tiny",
        "--input",
        &input.display().to_string(),
        "--job",
        "core1",
        "--shard-size",
        "100",
        "--id-field",
        "id",
    ])?;
    assert_eq!(job, "core1", "submit prints the job id alone");
    let status = fleet.wait_job(&job, Duration::from_secs(600))?;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["done"], 100);
    assert_eq!(status["records_done"], 10_000);
    eprintln!(
        "job of 10,000 records in 100 shards done in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let npy = fleet.dir.path().join("vectors.npy");
    let said = fleet.cli(&["collect", &job, "--output", &npy.display().to_string()])?;
    assert!(said.contains("10000 vectors"), "{said}");
    let (rows, dim, got) = read_npy_f32(&npy)?;
    assert_eq!((rows, dim), (10_000, 32));

    let model = minions_worker::model::BertEmbedder::load(
        &model_dir,
        &candle_core::Device::Cpu,
        minions_worker::model::Precision::F32,
    )?;
    let want = model.embed(&texts, minions_worker::model::Batching::texts(64))?;
    let diff = max_abs_diff(&got, &want);
    eprintln!("max abs diff between collected and in-process vectors: {diff:e}");
    assert!(
        diff <= 1e-5,
        "collected vectors differ from in-process ones by {diff}"
    );
    // Row i is record i: spot-check a few rows individually.
    for i in [0usize, 1, 99, 100, 5_555, 9_999] {
        let one = model.embed(&texts[i..=i], minions_worker::model::Batching::texts(1))?;
        assert!(
            max_abs_diff(&got[i * dim..(i + 1) * dim], &one) <= 1e-5,
            "row {i} is not record {i}"
        );
    }

    // The last ack lands just after the last done event.
    let until = Instant::now() + Duration::from_secs(10);
    while fleet.work_stream_messages().await? != 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        fleet.work_stream_messages().await?,
        0,
        "work stream must be empty"
    );

    let js = async_nats::jetstream::new(fleet.client().await?);
    let mut stream = js.get_stream(minions_schemas::streams::WORK_STREAM).await?;
    let before = stream.info().await?.state.last_sequence;
    let out = fleet.cli_raw(&[
        "submit",
        "--model",
        "tiny",
        "--input",
        &input.display().to_string(),
        "--job",
        "core1",
        "--shard-size",
        "100",
        "--id-field",
        "id",
    ])?;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "core1");
    let after = stream.info().await?.state.last_sequence;
    assert_eq!(
        after,
        before,
        "re-submit published {} messages",
        after - before
    );
    assert!(log.contains("published=0"), "{log}");
    eprintln!("re-submit of core1 published 0 new messages");
    Ok(())
}
