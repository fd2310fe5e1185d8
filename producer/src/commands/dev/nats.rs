//! The nats-servers of `minions dev`: one, or a loopback cluster configured
//! like deploy/nats/cluster/. Client ports are the user's (`--port`, and the
//! next ones for a cluster) or, with `--port 0`, ones each server picks; route
//! ports are always the servers' own choice. A server is taken as up only
//! when its ports file (named after its pid) says what it bound, so a port
//! that another process holds shows as this server's exit, never as
//! "something listens there".

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};

use super::{Proc, spawn, stop, stop_all};

/// The ports a started nats-server reported binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bound {
    /// Client connections.
    pub client: u16,
    /// Cluster routes, where it has them.
    pub route: Option<u16>,
}

/// How a started server came up.
#[derive(Debug, PartialEq, Eq)]
enum CameUp {
    Listening(Bound),
    /// It exited before listening (for example, another process held its
    /// client or monitoring port).
    Exited,
    TimedOut,
}

/// The port at the end of `url` (`nats://127.0.0.1:4222`).
fn port_of(url: &str) -> Option<u16> {
    url.rsplit(':').next()?.parse().ok()
}

/// What the nats-server with process id `pid` wrote into `dir` as its
/// ports file (`<program>_<pid>.ports`), once whole.
fn read_ports(dir: &Path, pid: u32) -> Option<Bound> {
    let suffix = format!("_{pid}.ports");
    let file = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().ends_with(&suffix))?;
    // A ports file is a few hundred bytes; a larger one is not nats-server's.
    if file.metadata().ok()?.len() > 64 * 1024 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(file.path()).ok()?).ok()?;
    let first = |key: &str| {
        v.get(key)
            .and_then(|a| a.get(0))
            .and_then(serde_json::Value::as_str)
            .and_then(port_of)
    };
    Some(Bound {
        client: first("nats")?,
        route: first("cluster"),
    })
}

/// Removes ports files that killed servers left in `dir`, so that a new
/// server that gets an old pid is not taken for the old one.
fn clear_ports(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "ports") {
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
        }
    }
    Ok(())
}

/// Waits until `p`, started with `--ports_file_dir dir`, has written its
/// ports file (it binds every listener first), exits, or `deadline` passes.
async fn come_up(p: &mut Proc, dir: &Path, deadline: Duration) -> CameUp {
    let until = tokio::time::Instant::now() + deadline;
    let Some(pid) = p.child.id() else {
        return CameUp::Exited;
    };
    while tokio::time::Instant::now() < until {
        if let Some(bound) = read_ports(dir, pid) {
            return CameUp::Listening(bound);
        }
        if matches!(p.child.try_wait(), Ok(Some(_))) {
            return CameUp::Exited;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    CameUp::TimedOut
}

/// A port argument: `-1` (the server picks one) for `None`.
fn port_arg(port: Option<u16>) -> String {
    port.map_or_else(|| "-1".to_owned(), |p| p.to_string())
}

/// The client port of server `i` (0-based) for `--port base`: `None` (the
/// server picks) for base 0.
fn client_port(base: u16, i: usize) -> anyhow::Result<Option<u16>> {
    if base == 0 {
        return Ok(None);
    }
    let p = u16::try_from(i)
        .ok()
        .and_then(|i| base.checked_add(i))
        .with_context(|| format!("--port {base} leaves no room for server {}", i + 1))?;
    Ok(Some(p))
}

/// The monitoring port for a server on client port `client`: client +
/// 4000 when nothing listens there now (as in deploy/nats/), `-1` (one it
/// picks) where the client port is the server's choice too, else none.
/// Something may take port + 4000 between this look and the server's bind:
/// the server then exits, and [`start_server`] starts it without monitoring.
async fn monitor_port(client: Option<u16>) -> Option<Option<u16>> {
    let Some(client) = client else {
        return Some(None);
    };
    let m = client.checked_add(4000)?;
    tokio::net::TcpStream::connect(("127.0.0.1", m))
        .await
        .is_err()
        .then_some(Some(m))
}

/// Starts one nats-server with JetStream on client port `port` (`0`: one it
/// picks), its store under `data_dir/jetstream`, its monitoring endpoints as
/// [`monitor_port`] says; returns it and its client port once it listens.
pub(super) async fn start_single(
    nats_bin: &Path,
    port: u16,
    data_dir: &Path,
) -> anyhow::Result<(Proc, u16)> {
    let client = client_port(port, 0)?;
    let ports_dir = data_dir.join("ports");
    let make_args = |monitor: Option<Option<u16>>| {
        let mut a: Vec<String> = vec![
            "-js".into(),
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port_arg(client),
            "-sd".into(),
            data_dir.join("jetstream").display().to_string(),
            "--server_name".into(),
            "minions-dev".into(),
            "--ports_file_dir".into(),
            ports_dir.display().to_string(),
        ];
        if let Some(m) = monitor {
            a.extend(["-m".into(), port_arg(m)]);
        }
        a
    };
    let monitor = monitor_port(client).await;
    let (p, bound) = start_server("nats", nats_bin, &ports_dir, monitor.is_some(), |m| {
        Ok(make_args(if m { monitor } else { None }))
    })
    .await?;
    Ok((p, bound.client))
}

/// Starts nats-server `name` with the arguments `args(monitored)` gives,
/// its ports file in `ports_dir`, and waits until it listens. When it was
/// `monitored` and exits at start (its monitoring port taken meanwhile), it
/// is started again without monitoring.
async fn start_server(
    name: &str,
    nats_bin: &Path,
    ports_dir: &Path,
    monitored: bool,
    args: impl Fn(bool) -> anyhow::Result<Vec<String>>,
) -> anyhow::Result<(Proc, Bound)> {
    clear_ports(ports_dir)?;
    let mut p = spawn(name, nats_bin, &args(monitored)?, &[])?;
    let mut came = come_up(&mut p, ports_dir, Duration::from_secs(15)).await;
    if came == CameUp::Exited && monitored {
        tracing::warn!(
            process = name,
            "nats-server exited at start; starting it again without monitoring"
        );
        clear_ports(ports_dir)?;
        p = spawn(name, nats_bin, &args(false)?, &[])?;
        came = come_up(&mut p, ports_dir, Duration::from_secs(15)).await;
    }
    match came {
        CameUp::Listening(bound) => Ok((p, bound)),
        CameUp::Exited => {
            stop(p, Duration::from_secs(2)).await;
            bail!("{name}: nats-server exited at start (is its port in use? its lines above say)")
        }
        CameUp::TimedOut => {
            stop(p, Duration::from_secs(2)).await;
            bail!("{name}: nats-server did not start listening within 15 s")
        }
    }
}

/// `path` as a quoted string of nats-server's config syntax.
fn conf_string(path: &Path) -> String {
    let raw = path.display().to_string();
    format!("\"{}\"", raw.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Where one cluster server listens and whom it routes to.
struct ServerPorts<'a> {
    /// Client port (`None`: its own choice).
    client: Option<u16>,
    /// Routes to solicit.
    routes: &'a [u16],
    /// Monitoring: absent, or on a port (`Some(None)`: its own choice).
    monitor: Option<Option<u16>>,
}

/// The config of server `i` (1-based) of a loopback cluster: the settings
/// of deploy/nats/cluster/n1.conf (a name per server, routes, flushing every
/// write before acknowledging it) on the given ports, a route port of its
/// own choosing, its store under `store`, its ports file in `ports_dir`.
fn cluster_config(i: usize, ports: &ServerPorts<'_>, store: &Path, ports_dir: &Path) -> String {
    let routes = ports
        .routes
        .iter()
        .map(|p| format!("    nats-route://127.0.0.1:{p}\n"))
        .collect::<String>();
    let http = ports.monitor.map_or(String::new(), |m| {
        format!("http: 127.0.0.1:{}\n", port_arg(m))
    });
    format!(
        "# Written by `minions dev --cluster`; rewritten on every start.\n\
         server_name: minions-dev-{i}\n\
         listen: 127.0.0.1:{client}\n\
         {http}\
         ports_file_dir: {ports_dir}\n\
         jetstream {{\n  store_dir: {store}\n  sync_interval: always\n}}\n\
         cluster {{\n  name: minions-dev\n  listen: 127.0.0.1:-1\n  routes: [\n{routes}  ]\n}}\n\
         max_payload: 1MB\n",
        client = port_arg(ports.client),
        store = conf_string(store),
        ports_dir = conf_string(ports_dir),
    )
}

/// A loopback port held bound but not listening: connections to it are
/// refused, and no other process can bind it while this lives.
///
/// JetStream runs clustered only with a configured route, and the other
/// servers' route ports are not known before they bind them; so the first
/// server's route points here, and the others route to the first.
pub(super) struct ClosedPort(socket2::Socket);

impl ClosedPort {
    fn bind() -> anyhow::Result<Self> {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .context("cannot make a socket")?;
        s.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
            .context("cannot bind a loopback port")?;
        Ok(Self(s))
    }

    fn port(&self) -> anyhow::Result<u16> {
        self.0
            .local_addr()?
            .as_socket()
            .map(|a| a.port())
            .context("not an IP socket")
    }
}

/// Starts a cluster of `servers` nats-servers on loopback, clients on
/// `port`, `port + 1`, ... (or where each picks, for port 0), routes where
/// each picks: the first routed to a [`ClosedPort`], the others to the
/// first (they learn the rest of the mesh from it). Each server's store and
/// config are under `data_dir/cluster/nI`. Returns the servers, their client
/// ports, and the closed port to hold while they run.
pub(super) async fn start_cluster(
    nats_bin: &Path,
    port: u16,
    servers: usize,
    data_dir: &Path,
) -> anyhow::Result<(Vec<Proc>, Vec<u16>, ClosedPort)> {
    if servers.is_multiple_of(2) {
        bail!(
            "--cluster {servers}: JetStream needs a majority of its servers, so an even count \
             survives no more failures than one server fewer; use 1, 3 or 5"
        );
    }
    let closed = ClosedPort::bind()?;
    let mut procs = Vec::with_capacity(servers);
    let mut clients = Vec::with_capacity(servers);
    let mut first_route = None;
    for i in 0..servers {
        let started = async {
            let client = client_port(port, i)?;
            let seed = match first_route {
                None => closed.port()?,
                Some(r) => r,
            };
            let monitor = monitor_port(client).await;
            let dir = data_dir.join("cluster").join(format!("n{}", i + 1));
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let conf = dir.join("nats.conf");
            let routes = [seed];
            let write = |monitored: bool| -> anyhow::Result<Vec<String>> {
                let ports = ServerPorts {
                    client,
                    routes: &routes,
                    monitor: if monitored { monitor } else { None },
                };
                let text = cluster_config(i + 1, &ports, &dir.join("store"), &dir);
                std::fs::write(&conf, text)
                    .with_context(|| format!("cannot write {}", conf.display()))?;
                Ok(vec!["-c".into(), conf.display().to_string()])
            };
            start_server(
                &format!("nats-{}", i + 1),
                nats_bin,
                &dir,
                monitor.is_some(),
                write,
            )
            .await
        }
        .await;
        match started {
            Ok((p, bound)) => {
                if first_route.is_none() {
                    first_route = Some(
                        bound
                            .route
                            .context("the first server reported no route port")?,
                    );
                }
                procs.push(p);
                clients.push(bound.client);
            }
            Err(e) => {
                stop_all(procs, Duration::from_secs(5)).await;
                return Err(e);
            }
        }
    }
    Ok((procs, clients, closed))
}

/// Waits until the cluster at `urls` has a JetStream meta leader: the
/// stream list, which only the leader answers, comes back.
pub(super) async fn wait_for_meta_leader(urls: &str, within: Duration) -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_files_are_read_by_pid() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("nats-server_41.ports"),
            r#"{"nats":["nats://127.0.0.1:42217"],"cluster":["nats://127.0.0.1:40051"]}"#,
        )?;
        assert_eq!(
            read_ports(dir.path(), 41),
            Some(Bound {
                client: 42217,
                route: Some(40051)
            })
        );
        assert_eq!(read_ports(dir.path(), 4), None);
        clear_ports(dir.path())?;
        assert_eq!(read_ports(dir.path(), 41), None);
        Ok(())
    }

    #[test]
    fn a_cluster_config_binds_what_it_is_told() {
        let text = cluster_config(
            2,
            &ServerPorts {
                client: None,
                routes: &[40051],
                monitor: Some(None),
            },
            Path::new("/s"),
            Path::new("/p"),
        );
        assert!(text.contains("listen: 127.0.0.1:-1\n"), "{text}");
        assert!(text.contains("http: 127.0.0.1:-1\n"), "{text}");
        assert!(text.contains("nats-route://127.0.0.1:40051"), "{text}");
        assert!(text.contains("server_name: minions-dev-2"), "{text}");
        assert!(text.contains("ports_file_dir: \"/p\""), "{text}");
    }

    #[test]
    fn a_closed_port_refuses_connections() -> anyhow::Result<()> {
        let held = ClosedPort::bind()?;
        let port = held.port()?;
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_err());
        Ok(())
    }
}
