//! Sampled checks: a share of shards (`--verify`) runs again on another
//! machine, picked after each result arrives; a disagreement goes to a
//! third machine and the majority decides; a machine outvoted too often is
//! quarantined (it pulls nothing until `minions worker release`), its
//! results in open jobs are withdrawn and run again elsewhere, and the
//! collected output is what an undisturbed run gives.
//!
//! The faulty machine is a real worker started with the test-only fault
//! switch `MINIONS_TEST_PERTURB=N`, which shifts the first component of
//! every embedding of one shard in N by 0.25 (a cosine near 0.97).

use std::time::{Duration, Instant};

use minions_schemas::messages::{EventKind, JobManifest, Quarantine, VerdictOutcome};
use minions_schemas::{decode, limits, streams, subjects};
use minions_tests::{Fleet, Result, write_corpus};
use minions_worker::model::tiny::TinySpec;

/// The faulty worker's machine: workers are named w1, w2, ... in start
/// order, and it starts last.
const FAULTY: &str = "w4";

/// Starts a watchdog, three good workers and a faulty one that perturbs
/// one shard in `one_in`.
fn start_fleet(fleet: &mut Fleet, quarantine_after: &str, one_in: &str) -> Result<()> {
    fleet.add_watchdog(&[
        "--verify-key",
        "test fleet secret",
        "--quarantine-after",
        quarantine_after,
    ])?;
    for _ in 0..3 {
        fleet.add_worker(&[])?;
    }
    fleet.worker_env = vec![("MINIONS_TEST_PERTURB".into(), one_in.into())];
    fleet.add_worker(&[])?;
    fleet.worker_env.clear();
    Ok(())
}

/// Submits `input` as job `job` of the tiny model, one record per shard,
/// with 5 % of its shards checked.
fn submit_checked(fleet: &Fleet, input: &std::path::Path, job: &str) -> Result<()> {
    submit_verified(fleet, input, job, "1", "0.05")
}

/// Submits `input` as job `job` of the tiny model in shards of
/// `shard_size` records, with the share `verify` of its shards checked.
fn submit_verified(
    fleet: &Fleet,
    input: &std::path::Path,
    job: &str,
    shard_size: &str,
    verify: &str,
) -> Result<()> {
    fleet.cli(&[
        "submit",
        "--model",
        "tiny",
        "--input",
        &input.display().to_string(),
        "--shard-size",
        shard_size,
        "--job",
        job,
        "--verify",
        verify,
    ])?;
    Ok(())
}

/// The faulty machine's quarantine record, if written.
async fn quarantine_of(fleet: &Fleet, machine: &str) -> Result<Option<Quarantine>> {
    let js = async_nats::jetstream::new(fleet.client().await?);
    let kv = js.get_key_value(streams::QUARANTINE_BUCKET).await?;
    Ok(match kv.get(machine).await? {
        Some(b) => Some(decode(
            "quarantine record",
            &b,
            limits::MAX_QUARANTINE_BYTES,
        )?),
        None => None,
    })
}

/// What a job's events say about its checks: (check runs queued,
/// disagreements, results outvoted on `machine`).
async fn check_counts(fleet: &Fleet, job: &str, machine: &str) -> Result<(usize, usize, usize)> {
    let events = fleet.events(job).await?;
    let queued = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::CheckQueued { round: 1, .. }))
        .count();
    let disagreed = events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::Verdict {
                    outcome: VerdictOutcome::Disagreed,
                    ..
                }
            )
        })
        .count();
    let outvoted = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Verdict { outvoted, .. } => Some(outvoted),
            _ => None,
        })
        .flatten()
        .filter(|w| subjects::machine(w) == machine)
        .count();
    Ok((queued, disagreed, outvoted))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_faulty_machine_is_caught_quarantined_and_its_shards_run_again() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = always_wrong(&mut fleet).await;
    fleet.explain(r)
}

async fn always_wrong(fleet: &mut Fleet) -> Result<()> {
    let model = fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    let texts = write_corpus(&input, 2000)?;
    submit_checked(fleet, &input, "verified")?;
    let began = Instant::now();
    start_fleet(fleet, "2", "1")?;
    let status = fleet.wait_job("verified", Duration::from_secs(600))?;
    let secs = began.elapsed().as_secs_f64();
    assert_eq!(status["done"], 2000, "{status}");
    let q = quarantine_of(fleet, FAULTY)
        .await?
        .ok_or("the faulty machine was not quarantined")?;
    assert!(q.quarantined, "{q:?}");
    let (queued, disagreed, outvoted) = check_counts(fleet, "verified", FAULTY).await?;
    let manifest: JobManifest = decode(
        "job manifest",
        &std::fs::read(
            fleet
                .dir
                .path()
                .join("store/jobs/verified/manifest.msgpack"),
        )?,
        limits::MAX_MANIFEST_BYTES,
    )?;
    let by_faulty = manifest
        .shards
        .iter()
        .filter(|s| {
            s.worker
                .as_ref()
                .is_some_and(|w| subjects::machine(w) == FAULTY)
        })
        .count();
    eprintln!(
        "2000 shards in {secs:.0} s with --verify 0.05: {queued} shards checked, {} verified, {disagreed} disagreements; {outvoted} results of {FAULTY} outvoted; {FAULTY} quarantined ({}), {} results withdrawn and run again",
        manifest.verified, q.reason, manifest.rejected
    );
    eprintln!("status: {}", fleet.cli(&["status", "verified"])?);
    eprintln!("worker list:\n{}", fleet.cli(&["worker", "list"])?);
    // Check runs are pulled ahead of the job's remaining shards (queued
    // behind them, none could start before every shard was handed out).
    let events = fleet.events("verified").await?;
    let first_check = events
        .iter()
        .position(|e| matches!(e.kind, EventKind::Checked { .. }))
        .ok_or("no check run finished")?;
    let done_before = events[..first_check]
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Done { .. }))
        .count();
    eprintln!("the first check run finished after {done_before} of the job's 2000 shards");
    assert!(
        done_before < 1000,
        "check runs waited behind the job's shards: the first finished after {done_before} of 2000"
    );
    assert!(queued >= 40, "{queued} checks queued at 5 % of 2000");
    assert!(disagreed >= 2 && outvoted >= 2);
    assert_eq!(by_faulty, 0, "results of the quarantined machine remain");
    assert_eq!((manifest.done, manifest.failed), (2000, 0));
    assert!(manifest.disagreements as usize >= disagreed.min(1));
    fleet.collected_equals_in_process("verified", &model, &texts)?;

    // /metrics shows the checks; the quarantined worker pulls nothing.
    let (_, metrics) = minions_tests::web::get(&format!("{}/metrics", fleet.dashboards[0]))?;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("minions_checks_total{outcome=\"outvoted\"}"))
        .ok_or("no outvoted counter")?;
    eprintln!("/metrics: {line}");

    // An operator releases the machine: it pulls again.
    let out = fleet.cli(&["worker", "release", FAULTY])?;
    eprintln!("{out}");
    let q = quarantine_of(fleet, FAULTY).await?.ok_or("no record")?;
    assert!(!q.quarantined);
    Ok(())
}

/// The faulty machine perturbs one shard in 50: a check catches it only
/// when it picks one of those (one shard in 1,000 of the machine's at
/// `--verify 0.05`), so jobs are run until it is caught. Its results in
/// every job not complete before the watchdog looked (here: all) are then
/// withdrawn and run again, so that every job's output is an undisturbed
/// run's, the jobs that had completed before included.
#[tokio::test(flavor = "multi_thread")]
async fn a_machine_wrong_once_in_fifty_shards_is_caught() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = sometimes_wrong(&mut fleet).await;
    fleet.explain(r)
}

async fn sometimes_wrong(fleet: &mut Fleet) -> Result<()> {
    const JOB_SHARDS: usize = 2000;
    const MAX_JOBS: usize = 15;
    let model = fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    let texts = write_corpus(&input, JOB_SHARDS)?;
    start_fleet(fleet, "1", "50")?;
    let began = Instant::now();
    let mut jobs = Vec::new();
    let mut caught = None;
    for i in 1..=MAX_JOBS {
        let job = format!("fifty-{i}");
        submit_checked(fleet, &input, &job)?;
        jobs.push(job.clone());
        fleet.wait_job(&job, Duration::from_secs(600))?;
        if let Some(q) = quarantine_of(fleet, FAULTY).await?
            && q.quarantined
        {
            caught = Some(q);
            break;
        }
    }
    let q = caught.ok_or(format!(
        "{FAULTY} not caught in {MAX_JOBS} jobs of {JOB_SHARDS} shards"
    ))?;
    // How many shards the faulty machine had finished (its done events,
    // withdrawn ones included) when it was quarantined.
    let mut ran = 0;
    let mut checks = 0;
    for job in &jobs {
        let events = fleet.events(job).await?;
        ran += events
            .iter()
            .filter(|e| {
                subjects::machine(&e.worker) == FAULTY
                    && e.at_ms <= q.at_ms
                    && matches!(e.kind, EventKind::Done { .. })
            })
            .count();
        checks += events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::CheckQueued { round: 1, .. }))
            .count();
    }
    eprintln!(
        "{FAULTY} (wrong once in 50 shards) caught in job {} of {}, after {ran} of its shards ({} shards in all, {checks} checked, {:.0} s): {}",
        jobs.len(),
        MAX_JOBS,
        jobs.len() * JOB_SHARDS,
        began.elapsed().as_secs_f64(),
        q.reason
    );
    // Every job, earlier ones included, ends with no result of the faulty
    // machine and the in-process output.
    for job in &jobs {
        let until = Instant::now() + Duration::from_secs(300);
        loop {
            let status = fleet.wait_job(job, Duration::from_secs(300))?;
            // Its newest revision: a job complete before the machine was
            // caught has a first one that names it.
            let manifest = fleet.manifest(job).ok();
            let clean = manifest.as_ref().is_some_and(|m| {
                m.done as usize == JOB_SHARDS
                    && !m.shards.iter().any(|s| {
                        s.worker
                            .as_ref()
                            .is_some_and(|w| subjects::machine(w) == FAULTY)
                    })
            });
            if clean && status["done"] == JOB_SHARDS {
                break;
            }
            if Instant::now() > until {
                return Err(format!("job {job} kept results of {FAULTY}: {status}").into());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        fleet.collected_equals_in_process(job, &model, &texts)?;
    }
    Ok(())
}

/// A fleet of one machine never runs a check (a check runs on another
/// machine than the result's): `status` and the job page say so while the
/// checks wait, and after the watchdog's `--checks-wait-secs` they close
/// undecided, the job completes, and the manifest counts those shards as
/// unverified.
#[tokio::test(flavor = "multi_thread")]
async fn checks_with_no_second_machine_say_so_and_end_unverified() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = one_machine(&mut fleet).await;
    fleet.explain(r)
}

async fn one_machine(fleet: &mut Fleet) -> Result<()> {
    fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 8)?;
    fleet.add_watchdog(&["--checks-wait-secs", "6"])?;
    fleet.add_worker(&["--slots", "2"])?;
    submit_verified(fleet, &input, "alone", "1", "1")?;
    let waiting = fleet.wait_status("alone", Duration::from_secs(60), |v| {
        v["done"] == 8 && v["verifying"].as_u64().unwrap_or(0) > 0
    })?;
    let said = fleet.cli(&["status", "alone"])?;
    assert!(said.contains("no second machine"), "{said}\n{waiting}");
    // The job page follows the events the watchdog has folded, which may
    // trail `status` by a moment (its last `done` still on the way).
    let base = fleet.dashboards.first().ok_or("no dashboard")?;
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, page) = minions_tests::web::get(&format!("{base}/api/jobs/alone"))?;
        assert_eq!(code, 200, "{page}");
        if page.contains("checks_wait") {
            break;
        }
        assert!(Instant::now() < until, "{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = fleet.wait_job("alone", Duration::from_secs(60))?;
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["unverified"], 8, "{done}");
    let m = fleet.manifest("alone")?;
    assert_eq!((m.done, m.verified, m.unverified), (8, 0, 8));
    eprintln!("one machine: 8 checks waited, said why, and closed unverified");
    Ok(())
}

/// A check run that reports after its machine was quarantined (it took the
/// run before it learnt of its quarantine) does not count, even when it
/// agrees: the round is queued again and another machine's run decides.
/// The late report is made here by hand, as machine `w9`.
#[tokio::test(flavor = "multi_thread")]
async fn a_check_run_from_a_quarantined_machine_does_not_count() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = late_check(&mut fleet).await;
    fleet.explain(r)
}

async fn late_check(fleet: &mut Fleet) -> Result<()> {
    use minions_schemas::messages::ShardEvent;
    use minions_schemas::{JobId, SCHEMA_VERSION, WorkerId, encode, keys};
    use sha2::Digest;

    fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 4)?;
    fleet.add_watchdog(&["--checks-wait-secs", "600"])?;
    fleet.add_worker(&[])?;
    submit_verified(fleet, &input, "late", "4", "1")?;
    fleet.wait_status("late", Duration::from_secs(60), |v| {
        v["done"] == 1 && v["verifying"] == 1
    })?;
    let js = async_nats::jetstream::new(fleet.client().await?);
    let kv = js.get_key_value(streams::QUARANTINE_BUCKET).await?;
    let now = minions_schemas::time::now_ms();
    let record = Quarantine {
        v: SCHEMA_VERSION,
        machine: "w9".into(),
        quarantined: true,
        strikes: 2,
        reason: "outvoted twice".into(),
        by: "test".into(),
        at_ms: now,
    };
    kv.put("w9", encode("quarantine record", &record)?.into())
        .await?;
    // The watchdogs read the bucket every few seconds.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let job = JobId::new("late")?;
    let output = std::fs::read(
        fleet
            .dir
            .path()
            .join("store")
            .join(keys::shard_output(&job, 0)),
    )?;
    let w9 = WorkerId::new("w9-late")?;
    let checked = ShardEvent {
        energy: None,
        v: SCHEMA_VERSION,
        job: job.clone(),
        shard: 0,
        worker: w9.clone(),
        host: "w9".into(),
        attempt: 1,
        at_ms: now,
        kind: EventKind::Checked {
            round: 1,
            rows: 4,
            output_bytes: 0,
            duration_ms: 1,
            compute_ms: 1,
            sha256: hex::encode(sha2::Sha256::digest(&output)),
            made_by: None,
        },
    };
    js.publish(
        subjects::event(&job, 0, &w9),
        encode("shard event", &checked)?.into(),
    )
    .await?
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s: serde_json::Value = serde_json::from_str(&fleet.cli(&["status", "late", "--json"])?)?;
    assert_eq!(
        (s["verified"].as_u64(), s["verifying"].as_u64()),
        (Some(0), Some(1)),
        "{s}"
    );
    fleet.add_worker(&[])?;
    let done = fleet.wait_job("late", Duration::from_secs(60))?;
    assert_eq!(
        (done["state"].as_str(), done["verified"].as_u64()),
        (Some("done"), Some(1)),
        "{done}"
    );
    let log = std::fs::read_to_string(&fleet.watchdogs[0].log)?;
    assert!(
        log.contains("made on a quarantined machine does not count"),
        "{log}"
    );
    Ok(())
}
