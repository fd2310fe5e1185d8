//! Operating a fleet: a shard that exhausts its deliveries through worker
//! deaths is dead-lettered by the watchdog (removed from the work stream);
//! drain, resume and evict steer one worker; cancel removes a job's pending
//! shards; reconcile republishes shards lost from the work stream.

use std::time::{Duration, Instant};

use minions_tests::{Fleet, Result, write_corpus};
use minions_worker::model::tiny::TinySpec;

fn worker_ids(fleet: &Fleet) -> Result<Vec<(String, String)>> {
    let v: serde_json::Value = serde_json::from_str(&fleet.cli(&["worker", "list", "--json"])?)?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .map(|w| {
                    (
                        w["worker"].as_str().unwrap_or_default().to_owned(),
                        w["state"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

async fn wait_worker(fleet: &Fleet, prefix: &str) -> Result<String> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((id, _)) = worker_ids(fleet)?
            .into_iter()
            .find(|(id, s)| id.starts_with(prefix) && s != "dead" && s != "left")
        {
            return Ok(id);
        }
        if Instant::now() > until {
            return Err(format!("worker {prefix} never showed up").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn done(fleet: &Fleet, job: &str) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_str(&fleet.cli(&["status", job, "--json"])?)?;
    Ok(v["done"].as_u64().unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread")]
async fn max_deliveries_become_dead_letters() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = async {
        fleet.push_slow_model()?;
        let input = fleet.dir.path().join("in.jsonl");
        write_corpus(&input, 300)?;
        // This worker creates the work consumer: one delivery per shard.
        fleet.add_worker(&["--slots", "1", "--max-deliver", "1"])?;
        wait_worker(&fleet, "w1-").await?;
        fleet.add_watchdog(&[])?;
        let job = fleet.submit("slow", &input, 300, "md")?;
        fleet
            .wait_started(&job, 0, Duration::from_secs(60), |_| true)
            .await?;
        fleet.workers[0].signal(nix::sys::signal::Signal::SIGKILL)?;
        // JetStream notices exhausted deliveries when it next tries to deliver.
        fleet.add_worker(&["--slots", "1"])?;
        let status = fleet.wait_job(&job, Duration::from_secs(60))?;
        assert_eq!(status["state"], "failed", "{status}");
        let reason = status["failed_shards"][0]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            reason.contains("no worker finished it in 1 deliveries"),
            "{reason}"
        );
        eprintln!("dead-lettered after max deliveries: {reason}");
        let until = Instant::now() + Duration::from_secs(10);
        while fleet
            .count_messages("MINIONS_DEAD", "minions.dead.md.>")
            .await?
            < 1
            && Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            fleet
                .count_messages("MINIONS_DEAD", "minions.dead.md.>")
                .await?,
            1
        );
        // The max-deliveries record names the work-stream sequence.
        let dead = fleet.dead_letter(&job, 0).await?;
        assert!(dead.stream_seq > 0, "{dead:?}");
        assert_eq!(
            fleet.work_stream_messages().await?,
            0,
            "the watchdog removed the message"
        );
        Ok(())
    }
    .await;
    if r.is_err() {
        eprintln!("{}", fleet.logs());
    }
    r
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_resume_evict_cancel_reconcile() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = ops(&mut fleet).await;
    fleet.explain(r)
}

async fn ops(fleet: &mut Fleet) -> Result<()> {
    fleet.push_model("tiny", TinySpec::default())?;
    fleet.push_slow_model()?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 2000)?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&["--slots", "1"])?;
    let w1 = wait_worker(fleet, "w1-").await?;

    // Drain: the worker pulls nothing new; resume: it pulls again.
    let said = fleet.cli(&["worker", "drain", &w1])?;
    assert!(said.contains("draining"), "{said}");
    let job = fleet.submit("tiny", &input, 20, "drained")?;
    // A resubmit after the work stream's duplicate window (here shrunk to
    // 100 ms, as if hours had passed) queues none of the shards it holds.
    let js = async_nats::jetstream::new(fleet.client().await?);
    let mut work = js.get_stream(minions_schemas::streams::WORK_STREAM).await?;
    let mut config = work.info().await?.config.clone();
    let window = config.duplicate_window;
    config.duplicate_window = Duration::from_millis(100);
    js.update_stream(config.clone()).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    fleet.submit("tiny", &input, 20, "drained")?;
    assert_eq!(
        fleet.work_stream_messages().await?,
        100,
        "a resubmit queued shards again"
    );
    config.duplicate_window = window;
    js.update_stream(config).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(done(fleet, &job)?, 0, "a drained worker ran shards");
    let said = fleet.cli(&["worker", "resume", &w1])?;
    assert!(said.contains("resumed"), "{said}");
    assert_eq!(
        fleet.wait_job(&job, Duration::from_secs(120))?["state"],
        "done"
    );
    eprintln!("drain held 100 shards for 3 s; resume ran them");

    // Evict: a running shard is handed back at once and runs on another worker.
    let job = fleet.submit("slow", &input, 2000, "evicted")?;
    fleet
        .wait_started(&job, 0, Duration::from_secs(60), |w| w.starts_with("w1-"))
        .await?;
    fleet.add_worker(&["--slots", "1", "--cancel-check-secs", "0.5"])?;
    wait_worker(fleet, "w2-").await?;
    let said = fleet.cli(&["worker", "evict", &w1])?;
    assert!(said.contains("evicted (1 shards handed back)"), "{said}");
    let evicted_at = Instant::now();
    fleet
        .wait_started(&job, 0, Duration::from_secs(10), |w| w.starts_with("w2-"))
        .await?;
    eprintln!(
        "evicted shard running on w2 after {:.2} s",
        evicted_at.elapsed().as_secs_f64()
    );
    let w2 = wait_worker(fleet, "w2-").await?;

    // A cancellation the worker did not hear (only the store's marker is
    // written, as when the broadcast went out while it was disconnected)
    // still stops its shard.
    let root = fleet
        .store_url
        .strip_prefix("file://")
        .ok_or("the fleet's store is not a directory")?;
    let marker = std::path::Path::new(root).join(format!("jobs/{job}/cancelled"));
    std::fs::write(&marker, b"")?;
    let written = Instant::now();
    let log = &fleet.workers[1].log;
    while !std::fs::read_to_string(log)?.contains("cancellation marker is in the store") {
        if written.elapsed() > Duration::from_secs(30) {
            return Err("w2 never read the cancellation marker of its running job".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "a cancellation heard only through the store stopped w2's shard after {:.1} s",
        written.elapsed().as_secs_f64()
    );
    fleet.cli(&["cancel", &job])?;
    fleet.wait_job(&job, Duration::from_secs(1)).ok();

    // Cancel: pending shards removed, status says so.
    fleet.cli(&["worker", "drain", &w2])?;
    let job = fleet.submit("tiny", &input, 20, "cancelled")?;
    let said = fleet.cli(&["cancel", &job])?;
    assert!(said.contains("100 pending shards removed"), "{said}");
    let s: serde_json::Value = serde_json::from_str(&fleet.cli(&["status", &job, "--json"])?)?;
    assert_eq!(s["state"], "cancelled", "{s}");
    assert_eq!(fleet.work_stream_messages().await?, 0);

    // Reconcile: the work stream is lost (with its duplicate-detection
    // state); reconcile queues exactly the shards that are neither done nor
    // queued, and the job completes.
    let job = fleet.submit("tiny", &input, 20, "lost")?;
    let js = async_nats::jetstream::new(fleet.nats.client().await?);
    js.delete_stream(minions_schemas::streams::WORK_STREAM)
        .await?;
    let said = fleet.cli(&["reconcile", &job])?;
    assert!(
        said.contains("0 shards done or queued, 100 republished"),
        "{said}"
    );
    let said = fleet.cli(&["reconcile", &job])?;
    assert!(
        said.contains("100 shards done or queued, 0 republished"),
        "{said}"
    );
    fleet.cli(&["worker", "resume", &w2])?;
    assert_eq!(
        fleet.wait_job(&job, Duration::from_secs(120))?["state"],
        "done"
    );
    eprintln!("reconcile republished 100 lost shards once; the job completed");
    Ok(())
}
