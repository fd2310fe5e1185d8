//! Poison shards: 1% of a job's shards fail on every delivery. Each ends as a
//! dead-letter record with its reason after max deliveries, every other shard
//! completes, status says "completed with 2 failed", and `minions retry`
//! after fixing the cause completes them. Two watchdogs run: each dead letter
//! is recorded once. The manifest then names each output's maker (build,
//! device, kernel path), as the output itself does.

use std::collections::BTreeSet;
use std::time::Duration;

use minions_schemas::messages::ShardOutput;
use minions_schemas::{decode, limits};
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
    // The record names the task message's work-stream sequence.
    let dead = fleet.dead_letter("poison", 37).await?;
    eprintln!(
        "shard 37's record: work-stream sequence {}, {} deliveries",
        dead.stream_seq, dead.deliveries
    );
    assert!(dead.stream_seq > 0, "{dead:?}");
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
    check_makers(fleet).await
}

/// Every output, and the manifest for every done shard, records what made
/// it: the worker build (version and executable digest), device and CPU
/// kernel path.
async fn check_makers(fleet: &Fleet) -> Result<()> {
    let job = fleet.dir.path().join("store/jobs/poison");
    let mut manifest = None;
    for _ in 0..100 {
        if let Ok(m) = fleet.manifest("poison")
            && m.failed == 0
        {
            manifest = Some(m);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let manifest = manifest.ok_or("no manifest with every shard done after the retry")?;
    // Manifests are create-only: the retry's record is a new revision, and
    // the first still records the failures.
    let first = fleet.manifest_revision("poison", 1)?;
    assert!(
        first.failed > 0,
        "the first manifest was overwritten: {} failed",
        first.failed
    );
    let makers: BTreeSet<String> = manifest
        .shards
        .iter()
        .map(|s| {
            s.made_by
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default()
        })
        .collect();
    eprintln!("makers in the manifest: {makers:?}");
    for s in &manifest.shards {
        let made_by = s
            .made_by
            .as_ref()
            .ok_or(format!("shard {} has no maker", s.shard))?;
        let (version, digest) = made_by
            .build
            .split_once('+')
            .ok_or(format!("build {:?} has no digest", made_by.build))?;
        assert_eq!(version, env!("CARGO_PKG_VERSION"));
        assert!(
            digest.len() == 12 && digest.chars().all(|c| c.is_ascii_hexdigit()),
            "{made_by}"
        );
        assert_eq!(made_by.device, "cpu");
        assert!(
            ["portable", "avx2", "vnni", "avx512"].contains(&made_by.kernel.as_str()),
            "{made_by}"
        );
        let bytes = std::fs::read(job.join(format!("outputs/{:08}.msgpack", s.shard)))?;
        let out: ShardOutput = decode("shard output", &bytes, limits::MAX_SHARD_OUTPUT_BYTES)?;
        assert_eq!(out.made_by.as_ref(), Some(made_by), "shard {}", s.shard);
    }
    Ok(())
}
