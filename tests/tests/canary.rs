//! Canaries: every worker runs the known canary shard when it starts and a
//! watchdog judges its answers before it pulls any work. A worker whose
//! kernels give wrong answers (here forced by the test-only switch
//! `MINIONS_TEST_KERNEL_FAULT=1`, which shifts the linear layers' outputs)
//! is refused: it stops before touching a real shard, and the watchdog
//! quarantines its machine. With no watchdog running, the worker judges
//! itself against the known answer it was built with.

use std::time::Duration;

use minions_schemas::messages::{EventKind, Quarantine};
use minions_schemas::{decode, limits, streams, subjects};
use minions_tests::{Fleet, Result, write_corpus};
use minions_worker::model::tiny::TinySpec;

/// Starts a worker whose kernels are wrong and waits for it to stop;
/// returns its log.
fn faulty_worker_is_refused(fleet: &mut Fleet) -> Result<String> {
    fleet.worker_env = vec![("MINIONS_TEST_KERNEL_FAULT".into(), "1".into())];
    fleet.add_worker(&[])?;
    fleet.worker_env.clear();
    let w = fleet.workers.last_mut().ok_or("no worker")?;
    let status = w.wait_timeout(Duration::from_secs(60))?;
    let log = std::fs::read_to_string(&w.log)?;
    assert!(
        !status.success(),
        "a worker with wrong kernels ran on:\n{log}"
    );
    assert!(log.contains("failed its canary"), "{log}");
    assert!(!log.contains("shard done"), "{log}");
    Ok(log)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_with_wrong_kernels_is_refused_before_any_shard() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = refused(&mut fleet).await;
    fleet.explain(r)
}

async fn refused(fleet: &mut Fleet) -> Result<()> {
    let model = fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    let texts = write_corpus(&input, 40)?;
    // Work is waiting before any worker starts: a worker let through
    // would pull it at once.
    fleet.submit("tiny", &input, 1, "canary")?;

    // No watchdog yet: w1 judges itself, and stops.
    let log = faulty_worker_is_refused(fleet)?;
    assert!(log.contains("judged by this worker"), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("error:"))
        .unwrap_or_default();
    eprintln!("w1, no watchdog running: {line}");

    // A watchdog judges w2, refuses it and quarantines its machine.
    fleet.add_watchdog(&[])?;
    let log = faulty_worker_is_refused(fleet)?;
    assert!(log.contains("judged by watchdog1"), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("error:"))
        .unwrap_or_default();
    eprintln!("w2, judged by the watchdog: {line}");
    let js = async_nats::jetstream::new(fleet.client().await?);
    let kv = js.get_key_value(streams::QUARANTINE_BUCKET).await?;
    let bytes = kv.get("w2").await?.ok_or("w2 was not quarantined")?;
    let q: Quarantine = decode("quarantine record", &bytes, limits::MAX_QUARANTINE_BYTES)?;
    assert!(q.quarantined && q.reason.contains("canary"), "{q:?}");
    assert!(
        kv.get("w1").await?.is_none(),
        "w1 was judged by no watchdog"
    );

    // A sound worker passes and runs the job alone.
    fleet.add_worker(&[])?;
    let status = fleet.wait_job("canary", Duration::from_secs(120))?;
    assert_eq!(status["done"], 40, "{status}");
    let log = std::fs::read_to_string(&fleet.workers[2].log)?;
    let passed = log
        .lines()
        .find(|l| l.contains("canary passed"))
        .ok_or(format!("w3 never passed its canary:\n{log}"))?;
    assert!(passed.contains("watchdog1"), "{passed}");
    eprintln!("w3: {passed}");
    let events = fleet.events("canary").await?;
    let mut by: Vec<&str> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Done { .. } | EventKind::Started))
        .map(|e| subjects::machine(&e.worker))
        .collect();
    by.sort_unstable();
    by.dedup();
    assert_eq!(by, vec!["w3"], "shards ran on {by:?}");
    fleet.collected_equals_in_process("canary", &model, &texts)?;

    // `worker list` and /metrics show the refused machine.
    let list = fleet.cli(&["worker", "list"])?;
    assert!(list.contains("w2") && list.contains("canary"), "{list}");
    eprintln!("worker list:\n{list}");
    let (_, metrics) = minions_tests::web::get(&format!("{}/metrics", fleet.dashboards[0]))?;
    let canaries: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("minions_canaries_total{"))
        .collect();
    assert!(
        canaries.contains(&"minions_canaries_total{outcome=\"passed\"} 1")
            && canaries.contains(&"minions_canaries_total{outcome=\"failed\"} 1"),
        "{canaries:?}"
    );
    eprintln!("/metrics: {}", canaries.join(", "));
    Ok(())
}
