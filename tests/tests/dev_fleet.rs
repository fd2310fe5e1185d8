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
