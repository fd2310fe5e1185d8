//! `minions admin init` sets up the streams and the work consumer with the
//! settings given, once (running it again changes nothing), so that
//! programs whose NATS identity may not create or delete streams can run:
//! such a worker, started before the setup, says to run `minions admin
//! init`; after it, the worker starts, and its identity can neither delete
//! nor purge a stream nor publish a shard.

use std::time::Duration;

use minions_tests::ports::wait_nats;
use minions_tests::{NatsServer, Proc, Result, bin, minions_ok, scratch};

#[test]
fn admin_init_creates_once_with_the_settings_given() -> Result<()> {
    let nats = NatsServer::start()?;
    let env = vec![("MINIONS_NATS_URL".to_owned(), nats.url())];
    let first = minions_ok(
        &[
            "admin",
            "init",
            "--max-deliver",
            "7",
            "--ack-wait-secs",
            "30",
        ],
        &env,
    )?;
    eprintln!("{first}");
    assert!(first.contains("ready (created)"), "{first}");
    assert!(first.contains("ack wait 30 s, max deliver 7"), "{first}");
    assert_eq!(first.matches("stream MINIONS_").count(), 4, "{first}");
    let again = minions_ok(&["admin", "init"], &env)?;
    assert!(again.contains("ready (already set up)"), "{again}");
    assert!(again.contains("max deliver 7"), "{again}");
    assert!(again.contains("kept them"), "{again}");
    Ok(())
}

/// A server with an administrator and a worker identity that may not
/// create, delete or purge streams or consumers, nor publish shards.
/// It binds a port of its own choosing, which its ports file names.
fn restricted_server(dir: &std::path::Path) -> Result<(Proc, u16)> {
    let conf = dir.join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            r#"server_name: restricted
listen: 127.0.0.1:-1
ports_file_dir: "{ports}"
jetstream {{ store_dir: "{store}" }}
accounts {{
  MINIONS {{
    jetstream: enabled
    users: [
      {{ user: admin, password: admin-secret }}
      {{ user: worker, password: worker-secret, permissions: {{
          publish: {{ deny: [
            "$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.STREAM.DELETE.>",
            "$JS.API.STREAM.PURGE.>", "$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>",
            "$JS.API.CONSUMER.DELETE.>", "minions.work.>" ] }} }} }}
    ]
  }}
}}
"#,
            store = dir.join("js").display(),
            ports = dir.display(),
        ),
    )?;
    let nats_bin = minions_tests::tool("NATS_SERVER_BIN", "nats-server")?;
    let mut p = Proc::spawn(
        "nats-server",
        &nats_bin,
        &["-c".into(), conf.display().to_string()],
        &[],
        dir,
    )?;
    let ports = wait_nats(&mut p, dir, "restricted", Duration::from_secs(15))?;
    Ok((p, ports.client))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restricted_worker_needs_admin_init_and_cannot_touch_streams() -> Result<()> {
    let dir = scratch("minions-admin-")?;
    let (_nats, port) = restricted_server(dir.path())?;
    let url = format!("nats://127.0.0.1:{port}");
    let store = format!("file://{}", dir.path().join("store").display());
    let as_worker = vec![
        ("MINIONS_NATS_URL".to_owned(), url.clone()),
        ("MINIONS_STORE".to_owned(), store.clone()),
        ("MINIONS_NATS_USER".to_owned(), "worker".to_owned()),
        (
            "MINIONS_NATS_PASSWORD".to_owned(),
            "worker-secret".to_owned(),
        ),
        (
            "MINIONS_CACHE_DIR".to_owned(),
            dir.path().join("cache").display().to_string(),
        ),
        ("RUST_BACKTRACE".to_owned(), "0".to_owned()),
    ];
    // Before the setup the worker cannot create the streams, and says why.
    let out = std::process::Command::new(bin("minions-worker")?)
        .envs(as_worker.clone())
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    // The error line (log lines of background tasks may follow it).
    let last = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    eprintln!("restricted worker before init: {last}");
    assert!(!out.status.success());
    assert!(last.contains("minions admin init"), "{err}");

    // The administrator sets up; the worker then starts.
    let as_admin = vec![
        ("MINIONS_NATS_URL".to_owned(), url.clone()),
        ("MINIONS_NATS_USER".to_owned(), "admin".to_owned()),
        (
            "MINIONS_NATS_PASSWORD".to_owned(),
            "admin-secret".to_owned(),
        ),
    ];
    minions_ok(&["admin", "init"], &as_admin)?;
    let mut worker = Proc::spawn(
        "worker",
        &bin("minions-worker")?,
        &[],
        &as_worker,
        dir.path(),
    )?;
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&worker.log)?.contains("worker started") {
        assert!(
            std::time::Instant::now() < until,
            "restricted worker did not start:\n{}",
            worker.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    worker.kill();

    // The worker's identity can delete, purge and publish nothing it must not.
    minions_endpoints::nats::init_tls();
    let client =
        async_nats::ConnectOptions::with_user_and_password("worker".into(), "worker-secret".into())
            .request_timeout(Some(Duration::from_secs(2)))
            .connect(&url)
            .await?;
    let js = async_nats::jetstream::new(client);
    let deleted = js
        .delete_stream(minions_schemas::streams::WORK_STREAM)
        .await;
    assert!(deleted.is_err(), "a worker deleted the work stream");
    let mut work = js.get_stream(minions_schemas::streams::WORK_STREAM).await?;
    assert!(
        work.purge().await.is_err(),
        "a worker purged the work stream"
    );
    let published = match js.publish("minions.work.forged.0", "x".into()).await {
        Ok(ack) => ack.await.is_ok(),
        Err(_) => false,
    };
    assert!(!published, "a worker published a shard");
    assert_eq!(work.info().await?.state.messages, 0);
    eprintln!("restricted worker: delete, purge and shard publish refused; stream intact");
    Ok(())
}
