//! The shipped least-privilege nats-server config
//! (`deploy/nats/least-privilege.conf`): the core-path job runs with every
//! program on its own identity over TLS (CLI as `producer`, workers as
//! `worker`, the watchdog as `watchdog`, set up by `minions admin init` as
//! `admin`), and the worker identity — the one on every office machine — is
//! refused everything beyond its job, while what it needs works.

use std::time::Duration;

use futures::StreamExt;
use minions_schemas::{streams, subjects};
use minions_tests::{Fleet, NatsServer, Result, core_job_scenario, role_password};

#[tokio::test(flavor = "multi_thread")]
async fn the_core_path_job_runs_with_one_identity_per_role() -> Result<()> {
    let mut fleet = Fleet::least_privilege()?;
    let r = core_job_scenario(&mut fleet).await;
    fleet.explain(r)
}

async fn connect(nats: &NatsServer, user: &str) -> Result<async_nats::Client> {
    minions_schemas::endpoints::nats::init_tls();
    let password = role_password(user);
    let ca = nats.ca.clone().ok_or("no CA")?;
    Ok(
        async_nats::ConnectOptions::with_user_and_password(user.into(), password)
            .add_root_certificates(ca)
            .require_tls(true)
            .request_timeout(Some(Duration::from_secs(2)))
            .connect(nats.url())
            .await?,
    )
}

/// Whether a plain publish by `from` on `subject` reaches a subscriber.
async fn arrives(
    from: &async_nats::Client,
    admin: &async_nats::Client,
    subject: &str,
) -> Result<bool> {
    let mut sub = admin.subscribe(subject.to_owned()).await?;
    admin.flush().await?;
    from.publish(subject.to_owned(), "x".into()).await?;
    from.flush().await?;
    Ok(tokio::time::timeout(Duration::from_millis(500), sub.next())
        .await
        .ok()
        .flatten()
        .is_some())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_identity_may_do_its_job_and_nothing_else() -> Result<()> {
    let fleet = Fleet::least_privilege()?;
    let admin = connect(&fleet.nats, "admin").await?;
    let worker = connect(&fleet.nats, "worker").await?;
    let js = async_nats::jetstream::new(worker.clone());
    let mut refused = Vec::new();

    // Forbidden.
    let shard = match js.publish("minions.work.forged.0", "x".into()).await {
        Ok(ack) => ack.await.is_ok(),
        Err(_) => false,
    };
    assert!(!shard, "a worker published a shard");
    refused.push("publish a shard");
    assert!(js.delete_stream(streams::WORK_STREAM).await.is_err());
    refused.push("delete the work stream");
    let mut work = js.get_stream(streams::WORK_STREAM).await?;
    assert!(work.purge().await.is_err());
    refused.push("purge the work stream");
    let events = js.get_stream(streams::EVENTS_STREAM).await?;
    let read_events = events
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await;
    assert!(read_events.is_err(), "a worker read the events stream");
    refused.push("read the events stream (another consumer)");
    assert!(
        js.get_key_value(streams::WORKERS_BUCKET).await.is_err() || {
            let kv = js.get_key_value(streams::WORKERS_BUCKET).await?;
            kv.get("anyone").await.is_err()
        }
    );
    refused.push("read the worker registry");
    assert!(!arrives(&worker, &admin, "minions.ctl.someone-else").await?);
    refused.push("send control to another worker");
    assert!(!arrives(&worker, &admin, "minions.cancel.somejob").await?);
    refused.push("cancel a job");
    let mut spy = worker.subscribe("minions.work.>").await?;
    worker.flush().await?;
    admin.publish("minions.work.spied.0", "x".into()).await?;
    admin.flush().await?;
    let spied = tokio::time::timeout(Duration::from_millis(500), spy.next())
        .await
        .ok()
        .flatten()
        .is_some();
    assert!(!spied, "a worker subscribed to raw shard subjects");
    refused.push("subscribe to shard subjects");

    // Allowed: what a worker does.
    assert!(arrives(&worker, &admin, "minions.hb.w1-abc").await?);
    let event = js
        .publish(
            subjects::event(&minions_schemas::JobId::new("j")?, 0),
            "x".into(),
        )
        .await?
        .await;
    assert!(event.is_ok(), "a worker cannot store an event: {event:?}");
    assert!(work.info().await.is_ok());
    assert_eq!(
        work.info().await?.state.messages,
        1,
        "only the administrator's message (the spy check) may be queued"
    );
    eprintln!("worker identity refused: {}", refused.join(", "));
    eprintln!("worker identity allowed: heartbeat, shard event, stream info");
    Ok(())
}
