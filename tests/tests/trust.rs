//! Trusting results from machines the fleet does not control.
//!
//! A forged `done`: a rogue holder of a worker identity pulls a shard, acks
//! it without running it, and publishes `done` for an output that does not
//! exist. The watchdog does not count it: it records the forgery (a
//! `rejected` event naming the rogue), queues the shard again, a real
//! worker runs it, and the job completes with every output present, the
//! manifest naming the real worker and counting the rejection; the usage
//! ledger marks the rogue's delivery `forged`.
//!
//! A check run (the worker side of sampled checks): another machine runs a
//! shard again and writes its output beside the shard's.

use std::time::Duration;

use futures::StreamExt;
use minions_schemas::messages::{
    EventKind, JobManifest, ShardEvent, ShardOutput, ShardTask, WATCHDOG_HOST,
};
use minions_schemas::time::now_ms;
use minions_schemas::{JobId, SCHEMA_VERSION, WorkerId, decode, encode, limits, streams, subjects};
use minions_tests::postgres::PgServer;
use minions_tests::web::get;
use minions_tests::{Fleet, Result, write_corpus};
use minions_worker::model::tiny::TinySpec;

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_done_does_not_count_the_shard_runs_and_the_forgery_is_recorded() -> Result<()> {
    let pg = PgServer::start()?;
    let mut fleet = Fleet::local()?;
    let r = forged_done(&mut fleet, &pg.url()).await;
    fleet.explain(r)
}

async fn forged_done(fleet: &mut Fleet, ledger: &str) -> Result<()> {
    fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 200)?;
    fleet.submit("tiny", &input, 10, "forged")?;
    let job = JobId::new("forged")?;

    // The rogue takes a shard off the queue and acks it unrun.
    let client = fleet.client().await?;
    let js = async_nats::jetstream::new(client);
    let work = js.get_stream(streams::WORK_STREAM).await?;
    let consumer: async_nats::jetstream::consumer::PullConsumer = work
        .get_consumer(&minions_schemas::scheduling::job_consumer(&job))
        .await?;
    let mut batch = consumer.fetch().max_messages(1).messages().await?;
    let msg = batch.next().await.ok_or("no shard to take")??;
    let task: ShardTask = decode("shard task", &msg.payload, limits::MAX_TASK_BYTES)?;
    msg.ack().await?;
    let shard = task.shard;

    // ... and says it is done, under a worker identity.
    let rogue = WorkerId::new("rogue-0a1b2c3d")?;
    let forged = ShardEvent {
        v: SCHEMA_VERSION,
        job: job.clone(),
        shard,
        worker: rogue.clone(),
        host: "rogue".into(),
        attempt: 1,
        at_ms: now_ms(),
        kind: EventKind::Done {
            rows: 10,
            output_bytes: 1234,
            duration_ms: 5,
            compute_ms: 5,
            already_done: false,
            sha256: "ab".repeat(32),
            tokens: 0,
            audio_ms: 0,
            made_by: None,
        },
        energy: None,
    };
    js.publish(
        subjects::event(&job, shard, &rogue),
        encode("shard event", &forged)?.into(),
    )
    .await?
    .await?;
    eprintln!("forged a done for shard {shard} under {rogue}");

    fleet.add_watchdog(&["--ledger", ledger])?;
    fleet.add_worker(&[])?;
    fleet.add_worker(&[])?;

    // The manifest is written once every shard is really done.
    let manifest_path = fleet.dir.path().join("store/jobs/forged/manifest.msgpack");
    let until = std::time::Instant::now() + Duration::from_secs(120);
    let manifest = loop {
        if let Ok(bytes) = std::fs::read(&manifest_path) {
            break decode::<JobManifest>("job manifest", &bytes, limits::MAX_MANIFEST_BYTES)?;
        }
        if std::time::Instant::now() > until {
            return Err(format!("no manifest after 120 s\n{}", fleet.logs()).into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!((manifest.done, manifest.failed), (20, 0));
    assert_eq!(manifest.rejected, 1);
    let line = &manifest.shards[shard as usize];
    let by = line.worker.as_ref().ok_or("the shard names no worker")?;
    assert_ne!(by, &rogue, "the forged done was counted");
    assert!(
        fleet
            .dir
            .path()
            .join(format!("store/jobs/forged/outputs/{shard:08}.msgpack"))
            .is_file(),
        "the shard's output was written"
    );
    assert_eq!(fleet.output_count("forged")?, 20);

    // The forgery is on record: one rejection, from the watchdog, naming
    // the rogue and the forged checksum; the shard was queued again and
    // run by a real worker.
    let events = fleet.events("forged").await?;
    let rejections: Vec<&ShardEvent> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Rejected { .. }))
        .collect();
    assert_eq!(rejections.len(), 1, "{rejections:?}");
    let EventKind::Rejected { by, sha256, reason } = &rejections[0].kind else {
        return Err("not a rejection".into());
    };
    assert_eq!((by, sha256.as_str()), (&rogue, "ab".repeat(32).as_str()));
    assert_eq!(rejections[0].host, WATCHDOG_HOST);
    assert_eq!(rejections[0].shard, shard);
    eprintln!("recorded: shard {shard} of {by}: {reason}");
    let real_starts = events
        .iter()
        .filter(|e| e.shard == shard && matches!(e.kind, EventKind::Started))
        .count();
    assert!(real_starts >= 1, "the shard never ran");

    let status = fleet.wait_job("forged", Duration::from_secs(30))?;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["done"], 20);
    assert_eq!(status["rejected"], 1);
    let text = fleet.cli(&["status", "forged"])?;
    eprintln!("{text}");
    assert!(text.contains("1 results rejected"), "{text}");
    let (code, metrics) = get(&format!("{}/metrics", fleet.dashboards[0]))?;
    assert_eq!(code, 200);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("minions_shards_total{outcome=\"rejected\"}"))
        .ok_or("no rejected count in /metrics")?;
    eprintln!("/metrics: {line}");
    assert!(line.ends_with(" 1"), "{line}");

    // The ledger: the rogue's delivery is `forged`, with the reason; the
    // shard is done by the real worker; the job counts each shard once.
    let (client, conn) = tokio_postgres::connect(ledger, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let forged = client
            .query(
                "SELECT outcome, COALESCE(reason, '') FROM attempts
                  WHERE job = 'forged' AND worker = $1",
                &[&rogue.as_str()],
            )
            .await?;
        let job_row = client
            .query_opt(
                "SELECT shards_done, records_done, state FROM jobs WHERE job = 'forged'",
                &[],
            )
            .await?;
        let shard_by = client
            .query_opt(
                "SELECT worker FROM shards WHERE job = 'forged' AND shard = $1",
                &[&i64::from(shard)],
            )
            .await?;
        let forged: Vec<(String, String)> = forged.iter().map(|r| (r.get(0), r.get(1))).collect();
        let job_row: Option<(i64, i64, String)> = job_row.map(|r| (r.get(0), r.get(1), r.get(2)));
        let shard_by: Option<String> = shard_by.map(|r| r.get(0));
        let settled = forged.len() == 1
            && forged[0].0 == "forged"
            && job_row == Some((20, 200, "done".to_owned()))
            && shard_by.as_deref().is_some_and(|w| w != rogue.as_str());
        if settled {
            eprintln!(
                "ledger: the rogue's delivery {:?}; shard {shard} done by {shard_by:?}; job row {job_row:?}",
                forged[0]
            );
            break;
        }
        if std::time::Instant::now() > until {
            return Err(format!(
                "the ledger did not settle: rogue's rows {forged:?}, job row {job_row:?}, shard {shard} by {shard_by:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(())
}

/// A check run: a task with `check` 1 that avoids the machine whose run it
/// checks is run by another machine, which writes its output beside the
/// shard's (not over it) and ends with a `checked` event; the job's state
/// does not change. On one kernel path the two outputs are equal.
#[tokio::test(flavor = "multi_thread")]
async fn a_check_run_goes_to_another_machine_and_writes_beside_the_output() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = check_run(&mut fleet).await;
    fleet.explain(r)
}

async fn check_run(fleet: &mut Fleet) -> Result<()> {
    fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 200)?;
    fleet.submit("tiny", &input, 10, "checked")?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&[])?;
    fleet.add_worker(&[])?;
    let status = fleet.wait_job("checked", Duration::from_secs(60))?;
    assert_eq!(status["done"], 20, "{status}");
    let job = JobId::new("checked")?;
    let shard = 3;
    let events = fleet.events("checked").await?;
    let ran = events
        .iter()
        .find(|e| e.shard == shard && matches!(e.kind, EventKind::Done { .. }))
        .ok_or("no done for the shard")?;
    let machine = subjects::machine(&ran.worker).to_owned();

    // The watchdog's part: queue a check run that avoids that machine.
    let client = fleet.client().await?;
    let js = async_nats::jetstream::new(client);
    let job_dir = fleet.dir.path().join("store/jobs/checked");
    let spec: minions_schemas::messages::JobSpec = decode(
        "job spec",
        &std::fs::read(job_dir.join("spec.msgpack"))?,
        limits::MAX_SPEC_BYTES,
    )?;
    minions_endpoints::queue::ensure_job_consumer(&js, &streams::WorkSettings::default(), &spec)
        .await?;
    let mut task = spec.task(shard);
    task.check = 1;
    task.avoid = vec![machine.clone()];
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        async_nats::header::NATS_MESSAGE_ID,
        format!("{}/check/1", subjects::msg_id(&job, shard)).as_str(),
    );
    js.publish_with_headers(
        subjects::work(&job, shard),
        headers,
        encode("shard task", &task)?.into(),
    )
    .await?
    .await?;

    let until = std::time::Instant::now() + Duration::from_secs(60);
    let checked = loop {
        let found = fleet
            .events("checked")
            .await?
            .into_iter()
            .find(|e| e.shard == shard && matches!(e.kind, EventKind::Checked { .. }));
        if let Some(e) = found {
            break e;
        }
        if std::time::Instant::now() > until {
            return Err(format!("no checked event after 60 s\n{}", fleet.logs()).into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let other = subjects::machine(&checked.worker).to_owned();
    eprintln!("shard {shard} ran on {machine}; its check run on {other}");
    assert_ne!(other, machine, "the check ran on the machine it checks");
    let EventKind::Checked { round, sha256, .. } = &checked.kind else {
        return Err("not a checked event".into());
    };
    assert_eq!(*round, 1);
    let check_bytes = std::fs::read(job_dir.join(format!("checks/{shard:08}/1.msgpack")))?;
    {
        use sha2::Digest;
        assert_eq!(&hex::encode(sha2::Sha256::digest(&check_bytes)), sha256);
    }
    let check: ShardOutput = decode("shard output", &check_bytes, limits::MAX_SHARD_OUTPUT_BYTES)?;
    let own: ShardOutput = decode(
        "shard output",
        &std::fs::read(job_dir.join(format!("outputs/{shard:08}.msgpack")))?,
        limits::MAX_SHARD_OUTPUT_BYTES,
    )?;
    assert_eq!(check.payload, own.payload, "one kernel path, one answer");
    assert_eq!(
        own.worker, ran.worker,
        "the shard's own output was left alone"
    );
    let status = fleet.wait_job("checked", Duration::from_secs(10))?;
    assert_eq!(
        (status["done"].as_u64(), status["running"].as_u64()),
        (Some(20), Some(0))
    );
    Ok(())
}
