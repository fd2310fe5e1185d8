//! A restarted watchdog rebuilds its view from NATS alone (the heartbeat
//! stream and the registry): a worker that dies right after the restart still
//! has its shard handed back within a few heartbeat intervals.

use std::time::Duration;

use minions_tests::{Fleet, Result, SlowShard};

#[tokio::test(flavor = "multi_thread")]
async fn restarted_watchdog_hands_back_a_dead_workers_shard() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    let SlowShard { job, .. } = fleet.slow_shard_on_first_worker("wdr", 1, &[]).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The watchdog dies and comes back; then the busy worker dies.
    fleet.watchdogs[0].kill();
    fleet.add_watchdog(&[])?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, took) = fleet.kill_first_worker(&job).await?;
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
