//! A worker paused (SIGSTOP) past its eviction, then resumed (SIGCONT): its
//! shards ran elsewhere meanwhile, it rejoins as a new session, and the
//! job's outputs are identical to an undisturbed run.

use std::time::{Duration, Instant};

use minions_tests::{Fleet, Result, write_corpus};
use minions_worker::model::tiny::TinySpec;

#[tokio::test(flavor = "multi_thread")]
async fn paused_worker_is_evicted_and_rejoins() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    let model = fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    let texts = write_corpus(&input, 3000)?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&["--slots", "1"])?;
    fleet.add_worker(&["--slots", "1"])?;
    let job = fleet.submit("tiny", &input, 20, "pause")?;
    fleet
        .wait_started(&job, 0, Duration::from_secs(60), |_| true)
        .await?;
    fleet.workers[0].signal(nix::sys::signal::Signal::SIGSTOP)?;
    let stopped = Instant::now();
    // Wait until the watchdog declares it dead, then a little more.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let list: serde_json::Value =
            serde_json::from_str(&fleet.cli(&["worker", "list", "--json"])?)?;
        let dead = list
            .as_array()
            .is_some_and(|r| r.iter().any(|w| w["state"] == "dead"));
        if dead {
            break;
        }
        assert!(
            Instant::now() < until,
            "paused worker never declared dead: {list}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "paused worker declared dead after {:.1} s",
        stopped.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    fleet.workers[0].signal(nix::sys::signal::Signal::SIGCONT)?;

    let status = fleet.wait_job(&job, Duration::from_secs(300))?;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(fleet.output_count(&job)?, 150);
    fleet.check_outputs(&job, &model, &texts)?;
    // The job may have finished on the other worker while this one was
    // paused: its rejoining then comes after the job's end.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&fleet.workers[0].log)?;
        if log.contains("rejoining as a new session") {
            break;
        }
        assert!(
            Instant::now() < until,
            "the resumed worker did not rejoin within 30 s:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "resumed worker rejoined; {} redeliveries; outputs identical",
        status["redeliveries"]
    );
    Ok(())
}
