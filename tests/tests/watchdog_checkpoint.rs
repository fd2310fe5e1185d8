//! A watchdog stopped cleanly checkpoints its folded events; the next one
//! resumes from that checkpoint (it says from which sequence), folds only
//! the events published since, shows both jobs as the events say, writes the
//! manifest of the job that completed while no watchdog ran and leaves the
//! one written before alone.

use std::time::{Duration, Instant};

use minions_tests::{Fleet, Result, web::get, write_corpus};

/// The value of `key=` on a log line (tracing's `key=value` fields).
fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.trim_matches('"').parse().ok())
}

/// Waits until the log of `fleet.watchdogs[i]` has a line with `needle`.
fn wait_log(fleet: &Fleet, i: usize, needle: &str, within: Duration) -> Result<String> {
    let until = Instant::now() + within;
    loop {
        let log = std::fs::read_to_string(&fleet.watchdogs[i].log).unwrap_or_default();
        if let Some(l) = log.lines().find(|l| l.contains(needle)) {
            return Ok(l.to_owned());
        }
        if Instant::now() > until {
            return Err(format!("watchdog{} never logged {needle:?}:\n{log}", i + 1).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn events_in_stream(fleet: &Fleet) -> Result<u64> {
    let js = async_nats::jetstream::new(fleet.nats.client().await?);
    let mut s = js
        .get_stream(minions_schemas::streams::EVENTS_STREAM)
        .await?;
    Ok(s.info().await?.state.last_sequence)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_watchdog_resumes_from_its_checkpoint() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    fleet.push_model("tiny", Default::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 200)?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&[])?;
    let first = fleet.submit("tiny", &input, 50, "before")?;
    fleet.wait_job(&first, Duration::from_secs(60))?;
    wait_log(
        fleet,
        0,
        "job complete; manifest written",
        Duration::from_secs(10),
    )?;
    let jobs_dir = fleet.dir.path().join("store/jobs");
    let manifest = |job: &str| jobs_dir.join(job).join("manifest.msgpack");
    let first_manifest = std::fs::metadata(manifest(&first))?.modified()?;

    // A clean stop checkpoints everything folded.
    fleet.watchdogs[0].signal(nix::sys::signal::Signal::SIGTERM)?;
    fleet.watchdogs[0].wait_timeout(Duration::from_secs(15))?;
    let line = wait_log(fleet, 0, "checkpoint written", Duration::from_secs(1))?;
    let log0 = std::fs::read_to_string(&fleet.watchdogs[0].log)?;
    let seq = log0
        .lines()
        .filter(|l| l.contains("checkpoint written"))
        .filter_map(|l| field(l, "seq"))
        .max()
        .ok_or_else(|| format!("no seq in {line}"))?;
    assert_eq!(seq, events_in_stream(fleet).await?, "{log0}");

    // A job runs while no watchdog does: its events are the tail.
    let second = fleet.submit("tiny", &input, 100, "after")?;
    fleet.wait_job(&second, Duration::from_secs(60))?;
    let last = events_in_stream(fleet).await?;
    assert!(last > seq);

    fleet.add_watchdog(&[])?;
    let resumed = wait_log(
        fleet,
        1,
        "resuming from checkpoint",
        Duration::from_secs(10),
    )?;
    assert_eq!(field(&resumed, "seq"), Some(seq), "{resumed}");
    let caught = wait_log(fleet, 1, "events caught up", Duration::from_secs(10))?;
    assert_eq!(field(&caught, "seq"), Some(last), "{caught}");
    assert_eq!(field(&caught, "events"), Some(last - seq), "{caught}");
    let written = wait_log(
        fleet,
        1,
        "job complete; manifest written",
        Duration::from_secs(10),
    )?;
    assert!(written.contains("job=after"), "{written}");

    // The dashboard shows both jobs done, every shard once.
    let (status, body) = get(&format!("{}/api/fleet", fleet.dashboards[1]))?;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let jobs = v["jobs"].as_array().ok_or("no jobs in /api/fleet")?;
    for (job, shards) in [(&first, 4), (&second, 2)] {
        let j = jobs
            .iter()
            .find(|j| j["job"] == job.as_str())
            .ok_or_else(|| format!("{job} not on the dashboard: {body}"))?;
        assert_eq!(j["state"], "done", "{j}");
        assert_eq!(j["done"], shards, "{j}");
        assert_eq!(j["records_done"], 200, "{j}");
    }
    assert_eq!(v["counters"]["done"], 6, "{body}");
    assert_eq!(v["counters"]["records"], 400, "{body}");

    // The manifest written before the restart is left alone.
    let log1 = std::fs::read_to_string(&fleet.watchdogs[1].log)?;
    assert!(!log1.contains("job=before"), "{log1}");
    assert_eq!(
        std::fs::metadata(manifest(&first))?.modified()?,
        first_manifest
    );
    assert!(manifest(&second).is_file());
    Ok(())
}
