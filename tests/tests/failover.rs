//! Failover: a worker killed with SIGKILL mid-shard (ack wait 60 s, 1 s
//! heartbeats) has its shard running on another worker within 4 s, handed
//! back by the watchdog, not by the ack wait. Two watchdogs run: the shard is
//! handed back once and the death recorded once.

use std::time::{Duration, Instant};

use minions_tests::{Fleet, Result, SLOW, write_corpus};

#[tokio::test(flavor = "multi_thread")]
async fn killed_worker_shard_runs_elsewhere_within_4_s() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    let model = fleet.push_model("slow", SLOW)?;
    let input = fleet.dir.path().join("in.jsonl");
    let texts = write_corpus(&input, 500)?;
    fleet.add_watchdog(&[])?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&["--slots", "1", "--ack-wait-secs", "60"])?;
    let job = fleet.submit("slow", &input, 500, "kill9")?;
    let (first, _) = fleet
        .wait_started(&job, 0, Duration::from_secs(60), |_| true)
        .await?;
    assert!(first.starts_with("w1-"), "{first}");
    // The second worker joins while the first runs the only shard.
    fleet.add_worker(&["--slots", "1"])?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed_at = Instant::now();
    fleet.workers[0].signal(nix::sys::signal::Signal::SIGKILL)?;
    let (second, seen) = fleet
        .wait_started(&job, 0, Duration::from_secs(30), |w| w.starts_with("w2-"))
        .await?;
    let failover = seen.duration_since(killed_at);
    eprintln!(
        "SIGKILL of {first} -> shard running on {second} after {:.2} s (ack wait 60 s)",
        failover.as_secs_f64()
    );
    assert!(
        failover <= Duration::from_secs(4),
        "failover took {failover:?}"
    );

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
