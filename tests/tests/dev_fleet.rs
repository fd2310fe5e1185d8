//! `minions dev` runs a whole local fleet (nats-server, watchdog with its
//! dashboard, workers) that takes a job to the end, and SIGTERM (what Ctrl-C's process group
//! gets, too) stops every process cleanly.

use std::path::Path;
use std::time::{Duration, Instant};

use minions_tests::{
    Proc, Result, bin, free_port, scratch, submit_tiny_job, tool, wait_done, wait_for_port,
};

/// Starts `minions dev` with `args` in `dir` (its store `store`, its
/// workers' cache in `dir/cache`).
fn spawn_dev(dir: &Path, store: &str, args: &[String]) -> Result<Proc> {
    let nats_bin = tool("NATS_SERVER_BIN", "nats-server")?;
    let env = vec![
        ("NATS_SERVER_BIN".to_owned(), nats_bin.display().to_string()),
        ("MINIONS_STORE".to_owned(), store.to_owned()),
        (
            "MINIONS_CACHE_DIR".to_owned(),
            dir.join("cache").display().to_string(),
        ),
        ("RUST_LOG".to_owned(), "info".to_owned()),
    ];
    let mut all = vec!["dev".to_owned()];
    all.extend_from_slice(args);
    Proc::spawn("dev", &bin("minions")?, &all, &env, dir)
}

/// Sends `dev` SIGTERM, waits (60 s) until it exits, asserts it exited
/// cleanly, and returns its whole log (the servers' own shutdown lines can
/// push the supervisor's "stopped" lines far from the end).
#[track_caller]
fn stop_dev(dev: &mut Proc) -> Result<String> {
    dev.signal(nix::sys::signal::Signal::SIGTERM)?;
    let status = dev.wait_timeout(Duration::from_secs(60))?;
    let log = dev.log_tail(usize::MAX);
    assert!(
        status.success(),
        "dev exited with {status}:\n{}",
        tail(&log, 80)
    );
    Ok(log)
}

/// The last `n` lines of `log`.
fn tail(log: &str, n: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(n)..].join("\n")
}

/// Asserts that `log` reports each of `names` stopped; on failure shows the
/// supervisor's own lines (not the servers' chatter).
#[track_caller]
fn assert_stopped(log: &str, names: &[&str]) {
    for name in names {
        let tag = format!("process={name}");
        let supervisor: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("commands::dev"))
            .collect();
        assert!(
            supervisor
                .iter()
                .any(|l| l.contains(": stopped") && l.contains(&tag)),
            "{name} not reported stopped; the supervisor logged:\n{}",
            supervisor.join("\n")
        );
    }
}

/// The two fleets run one after the other: each picks free ports, and
/// side by side one could take a port the other picked before it binds.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn dev_runs_a_fleet_and_stops_cleanly() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch("minions-dev-")?;
    let port = free_port()?;
    let dash = free_port()?;
    let store = format!("file://{}", dir.path().join("store").display());
    let mut dev = spawn_dev(
        dir.path(),
        &store,
        &[
            "--workers".into(),
            "2".into(),
            "--port".into(),
            port.to_string(),
            "--data-dir".into(),
            dir.path().join("dev").display().to_string(),
            "--dashboard".into(),
            format!("127.0.0.1:{dash}"),
        ],
    )?;
    wait_for_port(port, Duration::from_secs(20))?;
    let cli_env = vec![
        (
            "MINIONS_NATS_URL".to_owned(),
            format!("nats://127.0.0.1:{port}"),
        ),
        ("MINIONS_STORE".to_owned(), store),
    ];
    let job = submit_tiny_job(dir.path(), &cli_env, 500, 50)?;
    wait_done(&cli_env, &job, Duration::from_secs(120), || {
        dev.log_tail(40)
    })?;

    // The dev fleet's watchdog serves its dashboard where asked.
    let (code, page) = minions_tests::web::get(&format!("http://127.0.0.1:{dash}/"))?;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains(&job), "the dashboard does not show job {job}");

    let log = stop_dev(&mut dev)?;
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nats-server still listens"
    );
    assert_stopped(&log, &["worker-1", "worker-2", "watchdog", "nats"]);
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
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch("minions-dev-cluster-")?;
    let port = three_free_ports()?;
    let store = format!("file://{}", dir.path().join("store").display());
    let data = dir.path().join("dev");
    let mut dev = spawn_dev(
        dir.path(),
        &store,
        &[
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
            dev.log_tail(200)
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
    let job = submit_tiny_job(dir.path(), &cli_env, 200, 20)?;
    let v = wait_done(&cli_env, &job, Duration::from_secs(60), || dev.log_tail(40))?;
    assert_eq!(v["done"], 10, "{v}");
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

    let log = stop_dev(&mut dev)?;
    for p in port..=port + 2 {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", p)).is_err(),
            "a nats-server still listens on {p}"
        );
    }
    assert_stopped(
        &log,
        &["worker-1", "watchdog", "nats-1", "nats-2", "nats-3"],
    );
    Ok(())
}
