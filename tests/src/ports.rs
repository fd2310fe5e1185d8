//! Where a server the harness started listens, learnt from the server
//! itself. No server here is handed a port that another process picked: a
//! number picked by binding port 0 and letting go of it can be taken by
//! anything before the server binds it, and then the server fails to start
//! while a check that only asks "does something listen there" talks to
//! whatever took the port. So servers bind port 0 themselves (nats-server
//! `-1`, moto and chromedriver `0`) and the harness reads the port they
//! bound: from nats-server's ports file (named after its pid) or from the
//! line the server logs. Every wait also checks that the process it waits
//! for is still alive, and for NATS that the port answers with the INFO of
//! the server it expects.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::{Proc, Result};

/// The ports a nats-server reported binding (its `--ports_file_dir` file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatsPorts {
    /// Client connections.
    pub client: u16,
    /// HTTP monitoring, when it serves it.
    pub monitoring: Option<u16>,
    /// Cluster routes, when it is part of a cluster.
    pub cluster: Option<u16>,
}

/// The port at the end of a URL or address (`nats://127.0.0.1:4222`).
fn port_of(url: &str) -> Option<u16> {
    url.trim_end_matches('/').rsplit(':').next()?.parse().ok()
}

/// The ports file that the nats-server with process id `pid` wrote into
/// `dir` (`<program>_<pid>.ports`), when it has written it whole.
pub fn read_nats_ports(dir: &Path, pid: u32) -> Option<NatsPorts> {
    let suffix = format!("_{pid}.ports");
    let file = std::fs::read_dir(dir)
        .ok()?
        .filter_map(std::result::Result::ok)
        .find(|e| e.file_name().to_string_lossy().ends_with(&suffix))?;
    let text = std::fs::read_to_string(file.path()).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let first = |key: &str| {
        v.get(key)
            .and_then(|a| a.get(0))
            .and_then(serde_json::Value::as_str)
            .and_then(port_of)
    };
    Some(NatsPorts {
        client: first("nats")?,
        monitoring: first("monitoring"),
        cluster: first("cluster"),
    })
}

/// Removes the ports files left in `dir` by servers that were killed (a
/// server removes its own when it stops cleanly), so that a new process that
/// happens to get an old pid is not taken for the old one.
pub fn clear_nats_ports(dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries {
        let e = e?;
        if e.file_name().to_string_lossy().ends_with(".ports") {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

/// The `server_name` in the INFO line that the NATS server on `port`
/// sends first (in plain text, also where TLS is required).
pub fn nats_server_name(port: u16) -> Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut line = String::new();
    // An INFO line is a few hundred bytes; a bound keeps a stranger on the
    // port from feeding us without end.
    let n = BufReader::new(std::io::Read::take(&s, 64 * 1024)).read_line(&mut line)?;
    let json = line[..n]
        .strip_prefix("INFO ")
        .ok_or_else(|| format!("port {port} does not speak NATS: {:?}", line.trim()))?;
    let info: serde_json::Value = serde_json::from_str(json.trim())?;
    Ok(info
        .get("server_name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_owned())
}

/// Fails when `proc` has exited, with its log's tail.
fn alive(proc: &mut Proc) -> Result<()> {
    match proc.child.try_wait()? {
        None => Ok(()),
        Some(status) => Err(format!(
            "{} exited ({status}) before it was ready:\n{}",
            proc.name,
            proc.log_tail(20)
        )
        .into()),
    }
}

/// Waits until the nats-server `proc`, started with `--ports_file_dir
/// ports_dir`, has written its ports file and its client port answers with
/// the INFO of server `name`; returns its ports. Fails at once when the
/// process exits (a port it was told to bind was taken, say), or after
/// `within`.
pub fn wait_nats(
    proc: &mut Proc,
    ports_dir: &Path,
    name: &str,
    within: Duration,
) -> Result<NatsPorts> {
    let until = Instant::now() + within;
    let pid = proc.child.id();
    let mut last = String::from("no ports file yet");
    loop {
        alive(proc)?;
        if let Some(ports) = read_nats_ports(ports_dir, pid) {
            match nats_server_name(ports.client) {
                Ok(n) if n == name => return Ok(ports),
                Ok(n) => {
                    return Err(format!(
                        "port {} answers as NATS server {n:?}, not {name:?}",
                        ports.client
                    )
                    .into());
                }
                Err(e) => last = e.to_string(),
            }
        }
        if Instant::now() > until {
            return Err(format!(
                "{} ({name}) not ready after {within:?} ({last}):\n{}",
                proc.name,
                proc.log_tail(20)
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `proc` logs a line containing `marker` followed by a port
/// (`... on port 33647.`, `Running on http://127.0.0.1:43365`) and that port
/// accepts connections; returns the port. Only lines written since `from`
/// bytes into the log count (a restarted process appends to the same log).
/// Fails at once when the process exits, or after `within`.
pub fn wait_logged_port(proc: &mut Proc, from: u64, marker: &str, within: Duration) -> Result<u16> {
    let until = Instant::now() + within;
    loop {
        alive(proc)?;
        if let Some(port) = logged_port(&proc.log, from, marker) {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
                return Ok(port);
            }
        }
        if Instant::now() > until {
            return Err(format!(
                "{} did not log `{marker}` and a port within {within:?}:\n{}",
                proc.name,
                proc.log_tail(20)
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The dashboard base URL (`http://127.0.0.1:PORT`) of a watchdog started
/// with `--listen 127.0.0.1:0`, from its `dashboard listening` log line
/// (logged at info by `minions_watchdog::run`); fails if it exits first.
pub fn dashboard_url(watchdog: &mut Proc, within: Duration) -> Result<String> {
    let port = wait_logged_port(watchdog, 0, "dashboard listening", within)?;
    Ok(format!("http://127.0.0.1:{port}"))
}

/// The port after `marker` on the first log line (from byte `from` on) that
/// has one: the digits after the last `:` or space that follows the marker.
fn logged_port(log: &Path, from: u64, marker: &str) -> Option<u16> {
    let bytes = std::fs::read(log).ok()?;
    let start = usize::try_from(from).ok()?.min(bytes.len());
    let text = String::from_utf8_lossy(&bytes[start..]);
    text.lines().find_map(|l| {
        let rest = &l[l.find(marker)? + marker.len()..];
        let digits: String = rest
            .rsplit([':', ' '])
            .find_map(|tail| {
                let d: String = tail.chars().take_while(char::is_ascii_digit).collect();
                (!d.is_empty()).then_some(d)
            })
            .unwrap_or_default();
        digits.parse().ok()
    })
}

/// The size of `proc`'s log now: lines it writes from here on start there.
pub fn log_len(log: &Path) -> u64 {
    std::fs::metadata(log).map_or(0, |m| m.len())
}

/// A loopback port held bound but not listening: a connection to it is
/// refused, and no other process can bind it while this lives. A cluster's
/// first nats-server is given a route here, since JetStream refuses to run
/// clustered without a configured route, and the others' route ports are not
/// known until they have bound them.
pub struct ClosedPort {
    socket: socket2::Socket,
}

impl ClosedPort {
    /// Binds a port of the kernel's choosing on 127.0.0.1 without listening.
    pub fn bind() -> Result<Self> {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        socket.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
        Ok(Self { socket })
    }

    /// The port it holds.
    pub fn port(&self) -> Result<u16> {
        self.socket
            .local_addr()?
            .as_socket()
            .map(|a| a.port())
            .ok_or_else(|| "not an IP socket".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_ports_are_read_after_their_marker() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("x.log");
        std::fs::write(
            &log,
            "Starting ChromeDriver 148.0 on port 0\n\
             ChromeDriver was started successfully on port 33647.\n \
             * Running on http://127.0.0.1:43365\n",
        )?;
        assert_eq!(
            logged_port(&log, 0, "started successfully on port"),
            Some(33647)
        );
        assert_eq!(logged_port(&log, 0, "Running on"), Some(43365));
        assert_eq!(logged_port(&log, 0, "Listening"), None);
        // Lines before `from` (an earlier process's) do not count.
        let text = std::fs::read_to_string(&log)?;
        let third = u64::try_from(text.find("* Running").ok_or("no third line")?)?;
        assert_eq!(logged_port(&log, third, "started successfully"), None);
        assert_eq!(logged_port(&log, third, "Running on"), Some(43365));
        Ok(())
    }

    #[test]
    fn a_closed_port_refuses_and_cannot_be_bound() -> Result<()> {
        let held = ClosedPort::bind()?;
        let port = held.port()?;
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_err());
        Ok(())
    }

    #[test]
    fn ports_files_are_read_by_pid() -> Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("nats-server_41.ports"),
            r#"{"nats":["nats://127.0.0.1:42217"],"monitoring":["http://127.0.0.1:39357"],"cluster":["nats://127.0.0.1:40051"]}"#,
        )?;
        assert_eq!(
            read_nats_ports(dir.path(), 41),
            Some(NatsPorts {
                client: 42217,
                monitoring: Some(39357),
                cluster: Some(40051)
            })
        );
        assert_eq!(read_nats_ports(dir.path(), 4), None);
        clear_nats_ports(dir.path())?;
        assert_eq!(read_nats_ports(dir.path(), 41), None);
        Ok(())
    }
}
