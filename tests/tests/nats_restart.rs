//! nats-server restarted mid-job (file storage): workers, watchdog and CLI
//! ride it out and the job completes with nothing lost.

use std::time::Duration;

use minions_tests::{Fleet, Result, write_corpus};
use minions_worker::model::tiny::TinySpec;

#[tokio::test(flavor = "multi_thread")]
async fn job_survives_a_nats_restart() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn scenario(fleet: &mut Fleet) -> Result<()> {
    let model = fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    let texts = write_corpus(&input, 6000)?;
    fleet.add_watchdog(&[])?;
    fleet.add_worker(&[])?;
    fleet.add_worker(&[])?;
    let job = fleet.submit("tiny", &input, 20, "restart")?;
    // Restart once some shards are done and many are left.
    loop {
        let s: serde_json::Value = serde_json::from_str(&fleet.cli(&["status", &job, "--json"])?)?;
        if s["done"].as_u64().unwrap_or(0) >= 20 {
            eprintln!(
                "restarting nats-server with {} of 300 shards done",
                s["done"]
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fleet.nats.restart()?;
    let status = fleet.wait_job(&job, Duration::from_secs(300))?;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(fleet.output_count(&job)?, 300);
    fleet.check_outputs(&job, &model, &texts)?;
    eprintln!(
        "job done after the restart: {} redeliveries",
        status["redeliveries"]
    );
    Ok(())
}

/// An events consumer that goes silent while the stream grows (here: paused
/// on the server, so its heartbeats keep coming and the client never
/// notices) is replaced, and reading goes on from the next sequence with
/// nothing skipped or read twice: for a follower of every event (the
/// watchdog's) and of one job's (`minions watch`'s).
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_events_consumer_is_replaced() -> Result<()> {
    use futures::TryStreamExt;
    use minions_endpoints::follow::Follower;

    let nats = minions_tests::NatsServer::start()?;
    let js = async_nats::jetstream::new(nats.client().await?);
    let stream = js
        .get_or_create_stream(minions_endpoints::streams::events_stream_config(1))
        .await?;
    let on = |job: &str| format!("minions.events.{job}.0.m");
    for job in ["j1", "j2", "j1"] {
        js.publish(on(job), job.to_owned().into()).await?.await?;
    }
    // One follower of every event, one of job j1's alone (as `minions watch`).
    let mut all = Follower::start_with(
        &js,
        minions_schemas::subjects::EVENT_SUBJECTS,
        0,
        Duration::from_millis(500),
    )
    .await?;
    let mut j1 =
        Follower::start_with(&js, "minions.events.j1.>", 0, Duration::from_millis(500)).await?;
    let (mut seen_all, mut seen_j1) = (Vec::new(), Vec::new());
    read_until(&mut all, &mut seen_all, 3).await?;
    read_until(&mut j1, &mut seen_j1, 2).await?;
    let until = async_nats::datetime::from_nanos(
        i128::from(minions_schemas::time::now_ms() + 3_600_000) * 1_000_000,
    )?;
    let names: Vec<String> = stream.consumer_names().try_collect().await?;
    for name in &names {
        stream.pause_consumer(name, until).await?;
    }
    for job in ["j2", "j1"] {
        js.publish(on(job), job.to_owned().into()).await?.await?;
    }
    read_until(&mut all, &mut seen_all, 5).await?;
    read_until(&mut j1, &mut seen_j1, 3).await?;
    assert_eq!(seen_all, vec![1, 2, 3, 4, 5]);
    assert_eq!(seen_j1, vec![1, 3, 5]);
    assert!(all.replaced() >= 1 && j1.replaced() >= 1);
    Ok(())
}

/// Reads from `f` into `seen` until it holds `n` sequences (20 s at most).
async fn read_until(
    f: &mut minions_endpoints::follow::Follower,
    seen: &mut Vec<u64>,
    n: usize,
) -> Result<()> {
    while seen.len() < n {
        match tokio::time::timeout(Duration::from_secs(20), f.next()).await {
            Ok(Some(r)) => seen.push(r?.seq),
            Ok(None) => return Err("the follower ended".into()),
            Err(_) => return Err(format!("no event after {seen:?}").into()),
        }
    }
    Ok(())
}

/// A delivery the server sent that no worker holds (here: taken by the
/// test and never answered, as a delivery lost with a dying server is) is
/// handed back once the watchdog is connected again after a restart, not
/// after the ack wait (five minutes here).
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_held_by_no_worker_comes_back_after_a_restart() -> Result<()> {
    let mut fleet = Fleet::local()?;
    let r = held_by_none(&mut fleet).await;
    fleet.explain(r)
}

async fn held_by_none(fleet: &mut Fleet) -> Result<()> {
    use futures::StreamExt;
    use std::time::Instant;

    fleet.push_model("tiny", TinySpec::default())?;
    let input = fleet.dir.path().join("in.jsonl");
    write_corpus(&input, 40)?;
    fleet.cli(&["admin", "init", "--ack-wait-secs", "300"])?;
    fleet.add_watchdog(&[])?;
    let job = fleet.submit("tiny", &input, 4, "held")?;
    let js = async_nats::jetstream::new(fleet.client().await?);
    let consumer: async_nats::jetstream::consumer::PullConsumer = js
        .get_stream(minions_schemas::streams::WORK_STREAM)
        .await?
        .get_consumer("job-held")
        .await?;
    let mut batch = consumer.fetch().max_messages(1).messages().await?;
    let taken = batch.next().await.ok_or("no shard delivered")??;
    eprintln!("taken and left unanswered: {}", taken.subject);
    // Stopped as an operator stops it (SIGTERM): the consumer keeps the
    // delivery as sent and unanswered.
    fleet.nats.proc.signal(nix::sys::signal::Signal::SIGTERM)?;
    fleet.nats.proc.wait_timeout(Duration::from_secs(30))?;
    fleet.nats.start_again()?;
    let restarted = Instant::now();
    fleet.add_worker(&[])?;
    let status = fleet.wait_job(&job, Duration::from_secs(120))?;
    assert_eq!(status["state"], "done", "{status}");
    eprintln!(
        "all 10 shards done {:.1} s after the restart, the one held by no one included",
        restarted.elapsed().as_secs_f64()
    );
    let log = std::fs::read_to_string(&fleet.watchdogs[0].log)?;
    assert!(log.contains("held by no worker"), "{log}");
    Ok(())
}
