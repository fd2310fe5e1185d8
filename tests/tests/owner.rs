//! Owner first, with a file-driven signal: when the owner becomes active
//! while a long shard runs, the shard starts on another worker within 1 s,
//! the yielding worker pulls nothing until the owner is away again (for the
//! resume period), and it releases its models. A signal flapping every
//! 200 ms causes one hand-back, not many.

use std::time::{Duration, Instant};

use minions_tests::{Fleet, Result, log_count, write_corpus};
use minions_worker::model::tiny::TinySpec;

#[tokio::test(flavor = "multi_thread")]
async fn owner_return_hands_the_shard_elsewhere_within_a_second() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = yield_scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn yield_scenario(fleet: &mut Fleet) -> Result<()> {
    fleet.push_slow_model()?;
    fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 500)?;
    let (policy, signal) = fleet.owner_policy(3)?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&["--slots", "1", "--policy", &policy])?;
    let job = fleet.submit("slow", &input, 500, "owned")?;
    fleet
        .wait_started(&job, 0, Duration::from_secs(60), |w| w.starts_with("w1-"))
        .await?;
    fleet.add_worker(&["--slots", "1"])?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    std::fs::write(&signal, "active\n")?;
    let returned = Instant::now();
    let (_, seen) = fleet
        .wait_started(&job, 0, Duration::from_secs(10), |w| w.starts_with("w2-"))
        .await?;
    let took = seen.duration_since(returned);
    eprintln!(
        "owner active -> shard running on another worker after {:.2} s",
        took.as_secs_f64()
    );
    assert!(took <= Duration::from_secs(1), "hand-back took {took:?}");
    let log = fleet.workers[0].log.clone();
    assert_eq!(log_count(&log, "yielding to the owner"), 1);
    assert_eq!(
        log_count(&log, "models released from memory"),
        1,
        "GPU memory not released"
    );
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let list = fleet.cli(&["worker", "list", "--json"])?;
        if list.contains("yielded: owner active") {
            break;
        }
        assert!(
            Instant::now() < until,
            "heartbeats do not carry the owner state: {list}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The hand-back is an event: the job and the watchdog's metrics count it.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&fleet.cli(&["status", &job, "--json"])?)?;
        let (_, metrics) = minions_tests::web::get(&format!("{}/metrics", fleet.dashboards[0]))?;
        if status["handed_back"] == 1
            && metrics
                .lines()
                .any(|l| l == "minions_owner_handbacks_total 1")
        {
            eprintln!("hand-back counted: status handed_back=1, minions_owner_handbacks_total 1");
            break;
        }
        assert!(
            Instant::now() < until,
            "hand-back not counted: {status}\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // While the owner is active the worker pulls nothing.
    let job2 = fleet.submit("tiny", &input, 5, "meanwhile")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let by_w1 = fleet
        .events(&job2)
        .await?
        .iter()
        .filter(|e| e.worker.as_str().starts_with("w1-"))
        .count();
    assert_eq!(by_w1, 0, "a yielded worker ran shards");

    // The owner leaves: after the resume period the worker lends again.
    std::fs::write(&signal, "idle\n")?;
    let until = Instant::now() + Duration::from_secs(15);
    while log_count(&log, "owner away: lending the GPU") < 2 {
        assert!(Instant::now() < until, "worker never resumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        fleet.wait_job(&job, Duration::from_secs(300))?["state"],
        "done"
    );
    assert_eq!(
        fleet.wait_job(&job2, Duration::from_secs(120))?["state"],
        "done"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn flapping_owner_signal_hands_back_once() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = flapping_scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn flapping_scenario(fleet: &mut Fleet) -> Result<()> {
    fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 3000)?;
    let (policy, signal) = fleet.owner_policy(2)?;
    fleet.add_worker(&["--slots", "1", "--policy", &policy])?;
    let job = fleet.submit("tiny", &input, 5, "flap")?;
    fleet
        .wait_started(&job, 0, Duration::from_secs(60), |_| true)
        .await?;
    let log = fleet.workers[0].log.clone();
    for i in 0..20 {
        std::fs::write(&signal, if i % 2 == 0 { "active\n" } else { "idle\n" })?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::write(&signal, "active\n")?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let yields = log_count(&log, "yielding to the owner");
    let resumes = log_count(&log, "owner away: lending the GPU");
    eprintln!("flapping every 200 ms for 4 s: {yields} yield, {resumes} lend (the first)");
    assert_eq!((yields, resumes), (1, 1));
    std::fs::write(&signal, "idle\n")?;
    assert_eq!(
        fleet.wait_job(&job, Duration::from_secs(120))?["state"],
        "done"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn quiet_mode_rests_in_proportion_to_work() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = async {
        fleet.push_slow_model()?;
        let input = fleet.dir.path().join("in.jsonl");
        write_corpus(&input, 200)?;
        let policy = fleet.dir.path().join("quiet.toml");
        std::fs::write(&policy, "max_duty_cycle = 0.5\n")?;
        fleet.add_worker(&["--slots", "1", "--policy", &policy.display().to_string()])?;
        let job = fleet.submit("slow", &input, 50, "quiet")?;
        assert_eq!(
            fleet.wait_job(&job, Duration::from_secs(300))?["state"],
            "done"
        );
        let events = fleet.events(&job).await?;
        let first = events.iter().map(|e| e.at_ms).min().unwrap_or(0);
        let last = events.iter().map(|e| e.at_ms).max().unwrap_or(0);
        let compute: u64 = events
            .iter()
            .map(|e| match e.kind {
                minions_schemas::messages::EventKind::Done { compute_ms, .. } => compute_ms,
                _ => 0,
            })
            .sum();
        let wall = last - first;
        eprintln!("duty cycle 0.5: {compute} ms of compute in {wall} ms of wall time");
        // Rests after the first three of four shards: at least 1.75 x compute.
        assert!(
            wall as f64 >= 1.6 * compute as f64,
            "quiet mode did not rest: {compute} ms in {wall} ms"
        );
        Ok(())
    }
    .await;
    fleet.explain(r)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_over_the_memory_cap_goes_to_another_machine() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = async {
        fleet.push_model("tiny", TinySpec::default())?;
        let input = fleet.dir.path().join("in.jsonl");
        write_corpus(&input, 50)?;
        let policy = fleet.dir.path().join("small.toml");
        std::fs::write(&policy, "max_memory_pct = 0.000001\n")?;
        fleet.add_worker(&["--slots", "1", "--policy", &policy.display().to_string()])?;
        let job = fleet.submit("tiny", &input, 256, "big")?;
        let log = fleet.workers[0].log.clone();
        let until = Instant::now() + Duration::from_secs(30);
        while log_count(&log, "more than the") == 0 {
            assert!(
                Instant::now() < until,
                "the capped worker did not refuse the model"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        fleet.add_worker(&["--slots", "1"])?;
        assert_eq!(
            fleet.wait_job(&job, Duration::from_secs(60))?["state"],
            "done"
        );
        let by_w1 = fleet
            .events(&job)
            .await?
            .iter()
            .filter(|e| {
                e.worker.as_str().starts_with("w1-")
                    && matches!(e.kind, minions_schemas::messages::EventKind::Done { .. })
            })
            .count();
        assert_eq!(by_w1, 0, "the capped worker ran the model");
        Ok(())
    }
    .await;
    fleet.explain(r)
}
