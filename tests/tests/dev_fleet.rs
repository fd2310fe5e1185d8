//! `minions dev` runs a whole local fleet (nats-server, watchdog with its
//! dashboard, workers) that takes a job to the end, and SIGTERM (what Ctrl-C's process group
//! gets, too) stops every process cleanly.

use std::time::{Duration, Instant};

use minions_tests::{
    Proc, Result, bin, free_port, minions_ok, scratch, tiny_model, tool, wait_for_port,
    write_corpus,
};

#[test]
fn dev_runs_a_fleet_and_stops_cleanly() -> Result<()> {
    let dir = scratch("minions-dev-")?;
    let port = free_port()?;
    let dash = free_port()?;
    let store = format!("file://{}", dir.path().join("store").display());
    let nats_bin = tool("NATS_SERVER_BIN", "nats-server")?;
    let env = vec![
        ("NATS_SERVER_BIN".to_owned(), nats_bin.display().to_string()),
        ("MINIONS_STORE".to_owned(), store.clone()),
        (
            "MINIONS_CACHE_DIR".to_owned(),
            dir.path().join("cache").display().to_string(),
        ),
        ("RUST_LOG".to_owned(), "info".to_owned()),
    ];
    let mut dev = Proc::spawn(
        "dev",
        &bin("minions")?,
        &[
            "dev".into(),
            "--workers".into(),
            "2".into(),
            "--port".into(),
            port.to_string(),
            "--data-dir".into(),
            dir.path().join("dev").display().to_string(),
            "--dashboard".into(),
            format!("127.0.0.1:{dash}"),
        ],
        &env,
        dir.path(),
    )?;
    wait_for_port(port, Duration::from_secs(20))?;
    let cli_env = vec![
        (
            "MINIONS_NATS_URL".to_owned(),
            format!("nats://127.0.0.1:{port}"),
        ),
        ("MINIONS_STORE".to_owned(), store),
    ];
    let model = tiny_model(dir.path(), "tiny")?;
    minions_ok(
        &[
            "model",
            "push",
            &model.display().to_string(),
            "--name",
            "tiny",
        ],
        &cli_env,
    )?;
    let input = dir.path().join("in.jsonl");
    write_corpus(&input, 500)?;
    let job = minions_ok(
        &[
            "submit",
            "--model",
            "tiny",
            "--input",
            &input.display().to_string(),
            "--shard-size",
            "50",
        ],
        &cli_env,
    )?;
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let s = minions_ok(&["status", &job, "--json"], &cli_env)?;
        let v: serde_json::Value = serde_json::from_str(&s)?;
        if v["state"] == "done" {
            break;
        }
        assert!(
            Instant::now() < until,
            "job not done: {s}\n{}",
            dev.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The dev fleet's watchdog serves its dashboard where asked.
    let (code, page) = minions_tests::web::get(&format!("http://127.0.0.1:{dash}/"))?;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains(&job), "the dashboard does not show job {job}");

    dev.signal(nix::sys::signal::Signal::SIGTERM)?;
    let status = dev.wait_timeout(Duration::from_secs(60))?;
    let log = dev.log_tail(200);
    assert!(status.success(), "dev exited with {status}:\n{log}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nats-server still listens"
    );
    for name in ["worker-1", "worker-2", "watchdog", "nats"] {
        let tag = format!("process={name}");
        assert!(
            log.lines()
                .any(|l| l.contains(": stopped") && l.contains(&tag)),
            "{name} not reported stopped:\n{log}"
        );
    }
    assert!(log.contains("worker stopped"), "{log}");
    assert!(!log.contains("did not stop in time"), "{log}");
    Ok(())
}

/// Three consecutive free ports on 127.0.0.1 (the dev cluster's clients).
fn three_free_ports() -> Result<u16> {
    for _ in 0..50 {
        let first = free_port()?;
        if first <= u16::MAX - 2
            && (1..=2).all(|i| std::net::TcpListener::bind(("127.0.0.1", first + i)).is_ok())
        {
            return Ok(first);
        }
    }
    Err("no three consecutive free ports".into())
}

/// `minions dev --cluster 3` runs three nats-servers, prints the URL list
/// to export, and its watchdog and workers create the streams with a copy
/// on every server; a job submitted to the list completes, and SIGTERM
/// stops all three servers.
#[test]
fn dev_cluster_runs_a_job_on_three_servers() -> Result<()> {
    let dir = scratch("minions-dev-cluster-")?;
    let port = three_free_ports()?;
    let store = format!("file://{}", dir.path().join("store").display());
    let nats_bin = tool("NATS_SERVER_BIN", "nats-server")?;
    let env = vec![
        ("NATS_SERVER_BIN".to_owned(), nats_bin.display().to_string()),
        ("MINIONS_STORE".to_owned(), store.clone()),
        (
            "MINIONS_CACHE_DIR".to_owned(),
            dir.path().join("cache").display().to_string(),
        ),
        ("RUST_LOG".to_owned(), "info".to_owned()),
    ];
    let data = dir.path().join("dev");
    let mut dev = Proc::spawn(
        "dev",
        &bin("minions")?,
        &[
            "dev".into(),
            "--cluster".into(),
            "3".into(),
            "--workers".into(),
            "1".into(),
            "--port".into(),
            port.to_string(),
            "--data-dir".into(),
            data.display().to_string(),
            "--dashboard".into(),
            "off".into(),
        ],
        &env,
        dir.path(),
    )?;
    let want = format!(
        "export MINIONS_NATS_URL=nats://127.0.0.1:{port},nats://127.0.0.1:{},nats://127.0.0.1:{}",
        port + 1,
        port + 2
    );
    let until = Instant::now() + Duration::from_secs(60);
    while minions_tests::log_count(&dev.log, &want) == 0 {
        assert!(
            Instant::now() < until,
            "no `{want}` line:\n{}",
            dev.log_tail(60)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        minions_tests::log_count(&dev.log, "export MINIONS_REPLICAS=3"),
        1,
        "{}",
        dev.log_tail(60)
    );
    // What a user exports from those two lines.
    let urls = want
        .trim_start_matches("export MINIONS_NATS_URL=")
        .to_owned();
    let cli_env = vec![
        ("MINIONS_NATS_URL".to_owned(), urls),
        ("MINIONS_REPLICAS".to_owned(), "3".to_owned()),
        ("MINIONS_STORE".to_owned(), store),
    ];
    let model = tiny_model(dir.path(), "tiny")?;
    minions_ok(
        &[
            "model",
            "push",
            &model.display().to_string(),
            "--name",
            "tiny",
        ],
        &cli_env,
    )?;
    let input = dir.path().join("in.jsonl");
    write_corpus(&input, 200)?;
    let job = minions_ok(
        &[
            "submit",
            "--model",
            "tiny",
            "--input",
            &input.display().to_string(),
            "--shard-size",
            "20",
        ],
        &cli_env,
    )?;
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let s = minions_ok(&["status", &job, "--json"], &cli_env)?;
        let v: serde_json::Value = serde_json::from_str(&s)?;
        if v["state"] == "done" {
            assert_eq!(v["done"], 10, "{s}");
            break;
        }
        assert!(
            Instant::now() < until,
            "job not done: {s}\n{}",
            dev.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Each server holds its own copy of the work queue.
    for i in 1..=3 {
        let copy = data
            .join("cluster")
            .join(format!("n{i}"))
            .join("store/jetstream/$G/streams/MINIONS_WORK");
        assert!(
            copy.is_dir(),
            "no copy of MINIONS_WORK at {}",
            copy.display()
        );
    }

    dev.signal(nix::sys::signal::Signal::SIGTERM)?;
    let status = dev.wait_timeout(Duration::from_secs(60))?;
    let log = dev.log_tail(300);
    assert!(status.success(), "dev exited with {status}:\n{log}");
    for p in port..=port + 2 {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", p)).is_err(),
            "a nats-server still listens on {p}"
        );
    }
    for name in ["worker-1", "watchdog", "nats-1", "nats-2", "nats-3"] {
        let tag = format!("process={name}");
        assert!(
            log.lines()
                .any(|l| l.contains(": stopped") && l.contains(&tag)),
            "{name} not reported stopped:\n{log}"
        );
    }
    Ok(())
}
