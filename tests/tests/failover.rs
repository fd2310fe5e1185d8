//! Failover: a worker killed with SIGKILL mid-shard (ack wait 60 s, 1 s
//! heartbeats) has its shard running on another worker within 4 s, handed
//! back by the watchdog, not by the ack wait. Two watchdogs run: the shard is
//! handed back once and the death recorded once.

use std::time::Duration;

use minions_tests::{Fleet, Result, SlowShard};

#[tokio::test(flavor = "multi_thread")]
async fn killed_worker_shard_runs_elsewhere_within_4_s() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    let SlowShard {
        job,
        model,
        texts,
        first,
    } = fleet.worker_failover("kill9", 2, "").await?;
    assert!(first.starts_with("w1-"), "{first}");

    let status = fleet.wait_job(&job, Duration::from_secs(300))?;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(fleet.output_count(&job)?, 1, "exactly one output");
    fleet.check_outputs(&job, &model, &texts)?;

    // Two watchdogs, one death record and one hand-back.
    let logs: String = fleet
        .watchdogs
        .iter()
        .map(|w| std::fs::read_to_string(&w.log).unwrap_or_default())
        .collect();
    let declared = logs
        .lines()
        .filter(|l| l.contains("worker declared dead"))
        .count();
    let handed = logs
        .lines()
        .filter(|l| l.contains("handed back the shard of a dead worker"))
        .count();
    eprintln!("watchdogs: {declared} death declared, {handed} hand-back");
    assert_eq!((declared, handed), (1, 1), "{logs}");
    let list = fleet.cli(&["worker", "list", "--json"])?;
    let rows: serde_json::Value = serde_json::from_str(&list)?;
    let dead = rows
        .as_array()
        .map(|r| r.iter().filter(|w| w["state"] == "dead").count())
        .unwrap_or(0);
    assert_eq!(dead, 1, "{list}");
    Ok(())
}
