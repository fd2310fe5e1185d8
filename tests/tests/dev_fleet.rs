//! `minions dev` runs a whole local fleet (nats-server, watchdog with its
//! dashboard, workers) that takes a job to the end, and SIGTERM (what Ctrl-C's process group
//! gets, too) stops every process cleanly.

use std::path::Path;
use std::time::{Duration, Instant};

use minions_tests::{Proc, Result, bin, scratch, submit_tiny_job, tool, wait_done};

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

/// Waits (60 s) until `dev` prints its `export MINIONS_NATS_URL=` line and
/// returns the URL list; fails at once if it exits first.
fn nats_url_of(dev: &mut Proc) -> Result<String> {
    let line = wait_line(dev, "export MINIONS_NATS_URL=")?;
    Ok(line
        .split("export MINIONS_NATS_URL=")
        .nth(1)
        .unwrap_or_default()
        .trim()
        .to_owned())
}

/// Waits (60 s) until `dev`'s log has a line containing `needle` and
/// returns it; fails at once if dev exits first.
fn wait_line(dev: &mut Proc, needle: &str) -> Result<String> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let log = std::fs::read_to_string(&dev.log).unwrap_or_default();
        if let Some(l) = log.lines().find(|l| l.contains(needle)) {
            return Ok(l.to_owned());
        }
        if let Some(status) = dev.child.try_wait()? {
            return Err(format!(
                "dev exited ({status}) before `{needle}`:\n{}",
                dev.log_tail(80)
            )
            .into());
        }
        if Instant::now() > until {
            return Err(format!("no `{needle}` line:\n{}", dev.log_tail(200)).into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The port of each `nats://127.0.0.1:PORT` in a URL list.
fn ports_of(urls: &str) -> Vec<u16> {
    urls.split(',')
        .filter_map(|u| u.rsplit(':').next()?.parse().ok())
        .collect()
}

/// Each fleet's servers bind ports of their own choosing (`--port 0`,
/// `--dashboard 127.0.0.1:0`), so the two can run side by side.
#[test]
fn dev_runs_a_fleet_and_stops_cleanly() -> Result<()> {
    let dir = scratch("minions-dev-")?;
    let store = format!("file://{}", dir.path().join("store").display());
    let mut dev = spawn_dev(
        dir.path(),
        &store,
        &[
            "--workers".into(),
            "2".into(),
            "--port".into(),
            "0".into(),
            "--data-dir".into(),
            dir.path().join("dev").display().to_string(),
            "--dashboard".into(),
            "127.0.0.1:0".into(),
        ],
    )?;
    let url = nats_url_of(&mut dev)?;
    let ports = ports_of(&url);
    assert_eq!(ports.len(), 1, "{url}");
    let cli_env = vec![
        ("MINIONS_NATS_URL".to_owned(), url.clone()),
        ("MINIONS_STORE".to_owned(), store),
    ];
    let job = submit_tiny_job(dir.path(), &cli_env, 500, 50)?;
    wait_done(&cli_env, &job, Duration::from_secs(120), || {
        dev.log_tail(40)
    })?;

    // The dev fleet's watchdog serves its dashboard where it says.
    let line = wait_line(&mut dev, "dashboard listening url=")?;
    let addr = line
        .split("url=http://")
        .nth(1)
        .and_then(|r| r.split(['/', ' ']).next())
        .ok_or_else(|| format!("no url in {line}"))?;
    let (code, page) = minions_tests::web::get(&format!("http://{addr}/"))?;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains(&job), "the dashboard does not show job {job}");
    // `dev` told where it is, and what to try next.
    let told = dev.log_tail(usize::MAX);
    assert!(
        told.contains(&format!("dashboard  http://{addr}/")),
        "dev did not print the dashboard's address {addr}:\n{}",
        tail(&told, 60)
    );
    assert!(told.contains("minions jobs"), "{}", tail(&told, 60));

    let log = stop_dev(&mut dev)?;
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", ports[0])).is_err(),
        "nats-server still listens"
    );
    assert_stopped(&log, &["worker-1", "worker-2", "watchdog", "nats"]);
    assert!(log.contains("worker stopped"), "{log}");
    assert!(!log.contains("did not stop in time"), "{log}");
    Ok(())
}

/// `minions dev --cluster 3` runs three nats-servers, prints the URL list
/// to export, and its watchdog and workers create the streams with a copy
/// on every server; a job submitted to the list completes, and SIGTERM
/// stops all three servers.
#[test]
fn dev_cluster_runs_a_job_on_three_servers() -> Result<()> {
    let dir = scratch("minions-dev-cluster-")?;
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
            "0".into(),
            "--data-dir".into(),
            data.display().to_string(),
            "--dashboard".into(),
            "off".into(),
        ],
    )?;
    // What a user exports from the two lines it prints.
    let urls = nats_url_of(&mut dev)?;
    let ports = ports_of(&urls);
    assert_eq!(ports.len(), 3, "{urls}");
    assert_eq!(
        minions_tests::log_count(&dev.log, "export MINIONS_REPLICAS=3"),
        1,
        "{}",
        dev.log_tail(60)
    );
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
    for p in ports {
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
