//! A real nats-server with JetStream for one test: alone, over TLS, or on the
//! shipped least-privilege config with its role passwords; killable and
//! restartable on the same port and store.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Proc, Result, minions_ok, ports, tool, workspace_root, write_test_certs};

/// A real nats-server with JetStream on a port it chose itself, with its
/// own store dir.
pub struct NatsServer {
    /// The server process.
    pub proc: Proc,
    /// Its client port (bound by the server; a restart binds it again).
    pub port: u16,
    /// With TLS required: the PEM file of the authority that signed the
    /// server's certificate (clients trust it with `--nats-ca`).
    pub ca: Option<PathBuf>,
    /// User and password for [`NatsServer::client`] where the server
    /// requires them (the administrator's).
    pub login: Option<(String, String)>,
    /// Its server name in a cluster (`n1`, `n2`, ...); empty alone.
    pub server_name: String,
    /// Its ports as it reported them at its last start.
    pub ports: ports::NatsPorts,
    /// The name it is started with and answers to in its INFO line: the
    /// cluster name where it has one, else a name unique to this process.
    name: String,
    /// Flags it is restarted with (a cluster node's routes and name).
    pub(crate) keep: Vec<String>,
    /// A cluster's first node: the closed port its first route pointed at
    /// (see [`ports::ClosedPort`]), held while it runs.
    pub(crate) anchor: Option<ports::ClosedPort>,
    dir: tempfile::TempDir,
}

/// A server name no other server started by this process has (tests of one
/// binary run side by side in threads).
fn unique_server_name() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("minions-test-{}-{n}", std::process::id())
}

/// The password of each role in `deploy/nats/least-privilege.conf`, as the
/// environment variables that config reads.
pub fn role_passwords() -> Vec<(String, String)> {
    ["ADMIN", "PRODUCER", "WATCHDOG", "WORKER"]
        .iter()
        .map(|r| {
            (
                format!("MINIONS_{r}_PASSWORD"),
                format!("{}-secret", r.to_lowercase()),
            )
        })
        .collect()
}

/// The password of `role` (`admin`, `producer`, `watchdog`, `worker`) in
/// [`role_passwords`].
pub fn role_password(role: &str) -> String {
    let key = format!("MINIONS_{}_PASSWORD", role.to_uppercase());
    role_passwords()
        .into_iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .unwrap_or_default()
}

impl NatsServer {
    /// Starts a server and waits until it accepts connections.
    pub fn start() -> Result<Self> {
        Self::start_with(&[])
    }

    /// Starts a server with `extra` command-line flags (say, `--user bob
    /// --pass secret`); it is not restarted with them.
    pub fn start_with(extra: &[&str]) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("minions-nats-").tempdir()?;
        let name = unique_server_name();
        let (proc, ports) = Self::spawn_with(dir.path(), &name, None, false, extra)?;
        Ok(Self::from_parts(proc, ports, None, name, dir))
    }

    /// Starts a server that accepts TLS connections only, with a certificate
    /// from a test authority written beside its store ([`NatsServer::ca`]).
    pub fn start_tls() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("minions-nats-").tempdir()?;
        let (ca, _, _) = write_test_certs(dir.path())?;
        let name = unique_server_name();
        let (proc, ports) = Self::spawn_with(dir.path(), &name, None, true, &[])?;
        Ok(Self::from_parts(proc, ports, Some(ca), name, dir))
    }

    /// Starts a server from a copy of the shipped
    /// `deploy/nats/least-privilege.conf` (on a port it picks, its own
    /// store, TLS from a test authority, the passwords of
    /// [`role_passwords`]), with a worker identity for each of `workers`
    /// added by `minions admin add-worker` (seeds at
    /// [`NatsServer::worker_seed`]) and the team identity `ana` by
    /// `minions admin add-producer` ([`NatsServer::producer_seed`]); it is
    /// not restarted.
    pub fn start_least_privilege(workers: &[&str]) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("minions-nats-").tempdir()?;
        let (ca, cert, key) = write_test_certs(dir.path())?;
        let conf = dir.path().join("least-privilege.conf");
        std::fs::copy(
            workspace_root().join("deploy/nats/least-privilege.conf"),
            &conf,
        )?;
        for w in workers {
            let seed = dir.path().join(format!("{w}.nk"));
            minions_ok(
                &[
                    "admin",
                    "add-worker",
                    w,
                    "--server-config",
                    &conf.display().to_string(),
                    "--seed-out",
                    &seed.display().to_string(),
                ],
                &[],
            )?;
        }
        // A team's identity (`minions admin add-producer`): `ana` may
        // submit for team alpha, at most at normal priority.
        minions_ok(
            &[
                "admin",
                "add-producer",
                "ana",
                "--team",
                "alpha",
                "--max-priority",
                "normal",
                "--server-config",
                &conf.display().to_string(),
                "--seed-out",
                &dir.path().join("ana.nk").display().to_string(),
            ],
            &[],
        )?;
        let name = unique_server_name();
        // Flags override the config: the port it picks, no monitoring, and
        // a name to know it by.
        let args: Vec<String> = vec![
            "-c".into(),
            conf.display().to_string(),
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            "-1".into(),
            "-m".into(),
            "0".into(),
            "--server_name".into(),
            name.clone(),
            "--ports_file_dir".into(),
            dir.path().display().to_string(),
        ];
        let mut env = role_passwords();
        env.push(("MINIONS_TLS_CERT".into(), cert.display().to_string()));
        env.push(("MINIONS_TLS_KEY".into(), key.display().to_string()));
        let bin = tool("NATS_SERVER_BIN", "nats-server")?;
        // The config's store_dir is relative: it lands in this server's dir.
        let mut proc = Proc::spawn_in(
            "nats-server",
            &bin,
            &args,
            &env,
            dir.path(),
            Some(dir.path()),
        )?;
        let ports = ports::wait_nats(&mut proc, dir.path(), &name, Duration::from_secs(15))?;
        Ok(Self::from_parts(proc, ports, Some(ca), name, dir))
    }

    pub(crate) fn from_parts(
        proc: Proc,
        ports: ports::NatsPorts,
        ca: Option<PathBuf>,
        name: String,
        dir: tempfile::TempDir,
    ) -> Self {
        Self {
            proc,
            port: ports.client,
            ports,
            ca,
            login: None,
            server_name: String::new(),
            name,
            keep: Vec::new(),
            anchor: None,
            dir,
        }
    }

    /// The nkey seed file of producer identity `name` (`ana`, of team
    /// alpha up to normal priority; see [`NatsServer::start_least_privilege`]).
    pub fn producer_seed(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.nk"))
    }

    /// The nkey seed file of worker machine `name` (see
    /// [`NatsServer::start_least_privilege`]).
    pub fn worker_seed(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.nk"))
    }

    /// Starts nats-server with JetStream, its store and ports file in `dir`,
    /// named `name`, on client port `port` (`None`: one it picks itself),
    /// and waits until it answers there as `name`.
    pub(crate) fn spawn_with(
        dir: &Path,
        name: &str,
        port: Option<u16>,
        tls: bool,
        extra: &[&str],
    ) -> Result<(Proc, ports::NatsPorts)> {
        let bin = tool("NATS_SERVER_BIN", "nats-server")?;
        let mut args: Vec<String> = vec![
            "-js".into(),
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.map_or_else(|| "-1".to_owned(), |p| p.to_string()),
            "-sd".into(),
            dir.join("js").display().to_string(),
            "--server_name".into(),
            name.to_owned(),
            "--ports_file_dir".into(),
            dir.display().to_string(),
        ];
        if tls {
            args.extend([
                "--tls".into(),
                "--tlscert".into(),
                dir.join("server.pem").display().to_string(),
                "--tlskey".into(),
                dir.join("server-key.pem").display().to_string(),
            ]);
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        ports::clear_nats_ports(dir)?;
        let mut proc = Proc::spawn("nats-server", &bin, &args, &[], dir)?;
        let ports = ports::wait_nats(&mut proc, dir, name, Duration::from_secs(15))?;
        Ok((proc, ports))
    }

    /// The client URL (`tls://` when TLS is required).
    pub fn url(&self) -> String {
        let scheme = if self.ca.is_some() { "tls" } else { "nats" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Kills the server and starts it again on the same port and store.
    pub fn restart(&mut self) -> Result<()> {
        self.proc.kill();
        self.start_again()
    }

    /// Starts a server that was killed ([`Proc::kill`]) again on the same
    /// port, store and flags.
    ///
    /// The ports are the ones this server bound before, not ones picked by
    /// another process, and clients know them, so they must stay. The
    /// window between its death and this bind is short, but something
    /// could bind the port inside it (say, a parallel test's server asking
    /// for any free port): the new process then fails to bind and exits,
    /// which the wait sees, and the start is tried again for a few seconds
    /// before it fails naming the port. It never answers in the server's
    /// place: the wait checks the INFO line of the server it expects.
    pub fn start_again(&mut self) -> Result<()> {
        let keep: Vec<&str> = self.keep.iter().map(String::as_str).collect();
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match Self::spawn_with(
                self.dir.path(),
                &self.name,
                Some(self.port),
                self.ca.is_some(),
                &keep,
            ) {
                Ok((proc, ports)) => {
                    self.proc = proc;
                    self.ports = ports;
                    return Ok(());
                }
                Err(e) if Instant::now() < until => {
                    eprintln!("restarting {} on port {}: {e}; again", self.name, self.port);
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => {
                    return Err(format!(
                        "{} could not start again on port {}: {e}",
                        self.name, self.port
                    )
                    .into());
                }
            }
        }
    }

    /// Connects a client.
    pub async fn client(&self) -> Result<async_nats::Client> {
        minions_endpoints::nats::init_tls();
        let mut o = match &self.login {
            Some((u, p)) => {
                async_nats::ConnectOptions::with_user_and_password(u.clone(), p.clone())
            }
            None => async_nats::ConnectOptions::new(),
        };
        if let Some(ca) = &self.ca {
            o = o.add_root_certificates(ca.clone()).require_tls(true);
        }
        Ok(o.connect(self.url()).await?)
    }
}
