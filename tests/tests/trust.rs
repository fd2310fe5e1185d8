//! Trusting results from machines the fleet does not control.
//!
//! A forged `done`: a rogue holder of a worker identity pulls a shard, acks
//! it without running it, and publishes `done` for an output that does not
//! exist. The watchdog does not count it: it records the forgery (a
//! `rejected` event naming the rogue), queues the shard again, a real
//! worker runs it, and the job completes with every output present, the
//! manifest naming the real worker and counting the rejection; the usage
//! ledger marks the rogue's delivery `forged`.

use std::time::Duration;

use futures::StreamExt;
use minions_schemas::messages::{EventKind, JobManifest, ShardEvent, ShardTask, WATCHDOG_HOST};
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
