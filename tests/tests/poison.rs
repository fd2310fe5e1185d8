//! Poison shards: 1% of a job's shards fail on every delivery. Each ends as a
//! dead-letter record with its reason after max deliveries, every other shard
//! completes, status says "completed with 2 failed", and `minions retry`
//! after fixing the cause completes them. Two watchdogs run: each dead letter
//! is recorded once.

use std::time::Duration;

use minions_tests::{Fleet, Result, write_corpus};
use minions_worker::model::tiny::TinySpec;

#[tokio::test(flavor = "multi_thread")]
async fn poison_shards_are_dead_lettered_then_retried() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 2000)?;
    fleet.submit("tiny", &input, 10, "poison")?;
    // The cause: two shards' inputs vanish from the store.
    for shard in [37, 151] {
        std::fs::remove_file(
            fleet
                .dir
                .path()
                .join(format!("store/jobs/poison/inputs/{shard:08}.msgpack")),
        )?;
    }
    fleet.add_watchdog(&[])?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&[])?;
    fleet.add_worker(&[])?;
    let status = fleet.wait_job("poison", Duration::from_secs(180))?;
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["done"], 198);
    assert_eq!(status["failed"], 2);
    let text = fleet.cli(&["status", "poison"])?;
    eprintln!("{text}");
    assert!(text.contains("completed with 2 failed"), "{text}");
    assert!(
        text.contains("shard 37 after 5 deliveries") && text.contains("missing from the store"),
        "{text}"
    );

    // One dead-letter record per poison shard, though two watchdogs run.
    let mut records = 0;
    for _ in 0..50 {
        records = fleet
            .count_messages("MINIONS_DEAD", "minions.dead.poison.>")
            .await?;
        if records >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    records = records.max(
        fleet
            .count_messages("MINIONS_DEAD", "minions.dead.poison.>")
            .await?,
    );
    eprintln!("dead-letter records: {records}");
    assert_eq!(records, 2);
    assert_eq!(
        fleet.work_stream_messages().await?,
        0,
        "nothing left in the work stream"
    );
    assert!(
        fleet
            .dir
            .path()
            .join("store/jobs/poison/manifest.msgpack")
            .is_file(),
        "manifest written"
    );

    // Fix the cause (submit again puts back the missing inputs; it queues nothing new
    // inside the duplicate window), then retry.
    fleet.submit("tiny", &input, 10, "poison")?;
    let said = fleet.cli(&["retry", "poison"])?;
    assert!(said.contains("2 failed shards resubmitted"), "{said}");
    let status = fleet.wait_job("poison", Duration::from_secs(120))?;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(fleet.output_count("poison")?, 200);
    eprintln!("after retry: {}", fleet.cli(&["status", "poison"])?);
    Ok(())
}
