//! A restarted watchdog rebuilds its view from NATS alone (the heartbeat
//! stream and the registry): a worker that dies right after the restart still
//! has its shard handed back within a few heartbeat intervals.

use std::time::{Duration, Instant};

use minions_tests::{Fleet, Result, SLOW, write_corpus};

#[tokio::test(flavor = "multi_thread")]
async fn restarted_watchdog_hands_back_a_dead_workers_shard() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    fleet.push_model("slow", SLOW)?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 500)?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&["--slots", "1"])?;
    let job = fleet.submit("slow", &input, 500, "wdr")?;
    fleet
        .wait_started(&job, 0, Duration::from_secs(60), |w| w.starts_with("w1-"))
        .await?;
    fleet.add_worker(&["--slots", "1"])?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The watchdog dies and comes back; then the busy worker dies.
    fleet.watchdogs[0].kill();
    fleet.add_watchdog(&[])?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed_at = Instant::now();
    fleet.workers[0].signal(nix::sys::signal::Signal::SIGKILL)?;
    let (_, seen) = fleet
        .wait_started(&job, 0, Duration::from_secs(30), |w| w.starts_with("w2-"))
        .await?;
    let took = seen.duration_since(killed_at);
    eprintln!(
        "after a watchdog restart, SIGKILL -> shard running elsewhere in {:.2} s",
        took.as_secs_f64()
    );
    assert!(took <= Duration::from_secs(5), "{took:?}");
    let log = std::fs::read_to_string(&fleet.watchdogs[1].log)?;
    assert!(
        log.contains("watchdog started") && log.contains("workers=2"),
        "the restarted watchdog did not see both workers:\n{log}"
    );
    Ok(())
}
