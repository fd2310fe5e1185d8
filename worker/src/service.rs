//! Running the worker as a background service of the logged-in user:
//! `minions-worker install` writes and starts a systemd user unit on Linux or
//! a launchd LaunchAgent on macOS (background QoS, low I/O priority);
//! `uninstall` stops and removes it. With [`Scope::System`], a service of
//! the whole machine instead (a system unit, a LaunchDaemon).

use std::path::{Path, PathBuf};

/// The systemd unit's file name.
pub const SYSTEMD_UNIT: &str = "minions-worker.service";
/// The launchd label (and plist file stem).
pub const LAUNCHD_LABEL: &str = "io.minions.worker";

/// The system service's cache folder name, under `/var/cache` (systemd
/// makes it, see [`system_cache_dir`]).
const SYSTEM_CACHE_NAME: &str = "minions-worker";

/// The model cache of a service of the whole machine: a folder the
/// platform keeps for caches, not a home directory.
pub fn system_cache_dir() -> PathBuf {
    if cfg!(target_os = "macos") {
        PathBuf::from("/Library/Caches").join(LAUNCHD_LABEL)
    } else {
        PathBuf::from("/var/cache").join(SYSTEM_CACHE_NAME)
    }
}

/// Whose service it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The logged-in user's: runs while they are logged in.
    User,
    /// The machine's, started at boot; run as the named account (None:
    /// root).
    System {
        /// The account the worker runs as.
        run_as: Option<String>,
    },
}

impl Scope {
    fn is_system(&self) -> bool {
        matches!(self, Self::System { .. })
    }

    /// `systemctl`'s arguments before the verb.
    fn systemctl(&self) -> &'static [&'static str] {
        if self.is_system() { &[] } else { &["--user"] }
    }
}

/// Why installing or removing the service failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A file could not be written or removed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The service manager refused.
    #[error("{command} failed: {detail}")]
    Manager {
        /// The command run.
        command: String,
        /// Its output or error.
        detail: String,
    },
    /// No home directory to install into.
    #[error("cannot find the home directory; pass --unit-dir")]
    NoHome,
    /// `--cache-dir` was relative: a service starts elsewhere.
    #[error("--cache-dir {0:?} is relative; a service needs an absolute folder")]
    RelativeCacheDir(String),
    /// The service started and its worker stopped: the canary failed, or
    /// the worker could not start.
    #[error("the service started, but the worker stopped: {detail}. Logs: {logs}")]
    Stopped {
        /// The worker's own words.
        detail: String,
        /// Where its logs are.
        logs: String,
    },
    /// The service started and its worker recorded no start in time.
    #[error(
        "the service started, but its worker gave no canary verdict within {waited_s} s (still connecting to NATS, or it cannot write {record}); it is left running. Logs: {logs}"
    )]
    NoVerdict {
        /// How long was waited.
        waited_s: u64,
        /// The record file looked for.
        record: String,
        /// Where the logs are.
        logs: String,
    },
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
    {
        s.to_owned()
    } else {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

/// The systemd unit (of the user, or of the machine) that runs
/// `program args`.
pub fn systemd_unit(program: &Path, args: &[String], scope: &Scope) -> String {
    let mut exec = shell_quote(&program.display().to_string());
    for a in args {
        exec.push(' ');
        exec.push_str(&shell_quote(a));
    }
    let (user, wanted_by) = match scope {
        Scope::User => (String::new(), "default.target"),
        Scope::System { run_as } => (
            // The cache folder is made by systemd, owned by the account.
            format!(
                "{}CacheDirectory={SYSTEM_CACHE_NAME}\n",
                run_as
                    .as_ref()
                    .map_or_else(String::new, |u| format!("User={u}\n"))
            ),
            "multi-user.target",
        ),
    };
    format!(
        "[Unit]\n\
         Description=Minions worker: lends this machine's GPU to the fleet while its owner is away\n\
         After=network-online.target\n\
         Wants=network-online.target\n\n\
         [Service]\n\
         {user}ExecStart={exec}\n\
         Restart=on-failure\n\
         RestartSec=5\n\
         # Owner first: the lowest CPU and I/O priority.\n\
         Nice=19\n\
         IOSchedulingClass=idle\n\
         # SIGTERM drains: running shards finish (30 s), the rest are handed back.\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec=45\n\
         Environment=RUST_LOG=info\n\n\
         [Install]\n\
         WantedBy={wanted_by}\n"
    )
}

/// The launchd plist (a LaunchAgent, or with [`Scope::System`] a
/// LaunchDaemon) that runs `program args` in the background QoS class with
/// low I/O priority.
pub fn launchd_plist(program: &Path, args: &[String], log: &Path, scope: &Scope) -> String {
    let user = match scope {
        Scope::System { run_as: Some(u) } => {
            format!("<key>UserName</key><string>{}</string>\n", xml_escape(u))
        }
        _ => String::new(),
    };
    let mut argv = format!(
        "    <string>{}</string>\n",
        xml_escape(&program.display().to_string())
    );
    for a in args {
        argv.push_str(&format!("    <string>{}</string>\n", xml_escape(a)));
    }
    let log = xml_escape(&log.display().to_string());
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
         <plist version=\"1.0\">\n<dict>\n\
         <key>Label</key><string>{LAUNCHD_LABEL}</string>\n\
         <key>ProgramArguments</key>\n<array>\n{argv}</array>\n\
         <key>RunAtLoad</key><true/>\n\
         <key>KeepAlive</key><dict><key>SuccessfulExit</key><false/></dict>\n\
         <key>ProcessType</key><string>Background</string>\n\
         <key>LowPriorityIO</key><true/>\n\
         <key>Nice</key><integer>19</integer>\n\
         <key>ExitTimeOut</key><integer>45</integer>\n\
         <key>StandardErrorPath</key><string>{log}</string>\n\
         <key>StandardOutPath</key><string>{log}</string>\n\
         {user}</dict>\n</plist>\n"
    )
}

/// Where the service file goes by default on this platform.
pub fn default_dir(scope: &Scope) -> Result<PathBuf, ServiceError> {
    if scope.is_system() {
        return Ok(PathBuf::from(if cfg!(target_os = "macos") {
            "/Library/LaunchDaemons"
        } else {
            "/etc/systemd/system"
        }));
    }
    let home = dirs::home_dir().ok_or(ServiceError::NoHome)?;
    Ok(if cfg!(target_os = "macos") {
        home.join("Library/LaunchAgents")
    } else {
        home.join(".config/systemd/user")
    })
}

fn manager(program: &str, args: &[&str]) -> Result<(), ServiceError> {
    let command = format!("{program} {}", args.join(" "));
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| ServiceError::Manager {
            command: command.clone(),
            detail: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ServiceError::Manager {
            command,
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Where the service's logs go, as a command or a file to read.
pub fn logs_hint(scope: &Scope) -> String {
    if cfg!(target_os = "macos") {
        log_file(scope).display().to_string()
    } else if scope.is_system() {
        format!("journalctl -u {SYSTEMD_UNIT} -f")
    } else {
        format!("journalctl --user -u {SYSTEMD_UNIT} -f")
    }
}

/// The launchd service's log file.
fn log_file(scope: &Scope) -> PathBuf {
    if scope.is_system() {
        PathBuf::from("/Library/Logs/minions-worker.log")
    } else {
        dirs::home_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("Library/Logs/minions-worker.log")
    }
}

/// Writes the service file into `dir` and, unless `no_start`, loads and
/// starts it. Returns the file written.
pub fn install(
    dir: &Path,
    program: &Path,
    args: &[String],
    no_start: bool,
    scope: &Scope,
) -> Result<PathBuf, ServiceError> {
    std::fs::create_dir_all(dir).map_err(|source| ServiceError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let (path, text) = if cfg!(target_os = "macos") {
        (
            dir.join(format!("{LAUNCHD_LABEL}.plist")),
            launchd_plist(program, args, &log_file(scope), scope),
        )
    } else {
        (dir.join(SYSTEMD_UNIT), systemd_unit(program, args, scope))
    };
    std::fs::write(&path, text).map_err(|source| ServiceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    if !no_start {
        start(&path, scope)?;
    }
    Ok(path)
}

/// Loads the service file at `path` and (re)starts the service, so that a
/// second install with other flags runs with them.
fn start(path: &Path, scope: &Scope) -> Result<(), ServiceError> {
    let p = path.display().to_string();
    if cfg!(target_os = "macos") {
        if let Scope::System { run_as: Some(user) } = scope {
            // launchd makes no cache folder: make it the account's.
            let dir = system_cache_dir();
            std::fs::create_dir_all(&dir).map_err(|source| ServiceError::Io {
                path: dir.display().to_string(),
                source,
            })?;
            manager("chown", &[user.as_str(), &dir.display().to_string()])?;
        }
        // Not loaded yet is fine; loaded, it must be unloaded to reload.
        let _ = manager("launchctl", &["unload", &p]);
        manager("launchctl", &["load", "-w", &p])
    } else {
        let ctl = scope.systemctl();
        manager("systemctl", &[ctl, &["daemon-reload"]].concat())?;
        manager("systemctl", &[ctl, &["enable", SYSTEMD_UNIT]].concat())?;
        manager("systemctl", &[ctl, &["restart", SYSTEMD_UNIT]].concat())
    }
}

/// Stops (unless `no_stop`) and removes the service file from `dir`.
/// Returns the file removed, if there was one.
pub fn uninstall(
    dir: &Path,
    no_stop: bool,
    scope: &Scope,
) -> Result<Option<PathBuf>, ServiceError> {
    let path = if cfg!(target_os = "macos") {
        dir.join(format!("{LAUNCHD_LABEL}.plist"))
    } else {
        dir.join(SYSTEMD_UNIT)
    };
    if !path.exists() {
        return Ok(None);
    }
    if !no_stop {
        let p = path.display().to_string();
        if cfg!(target_os = "macos") {
            manager("launchctl", &["unload", "-w", &p])?;
        } else {
            manager(
                "systemctl",
                &[scope.systemctl(), &["disable", "--now", SYSTEMD_UNIT]].concat(),
            )?;
        }
    }
    std::fs::remove_file(&path).map_err(|source| ServiceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_and_plist_carry_the_command_line() {
        let args = vec![
            "--nats".to_owned(),
            "nats://h:4222".to_owned(),
            "--name".to_owned(),
            "a b".to_owned(),
        ];
        let unit = systemd_unit(Path::new("/opt/minions-worker"), &args, &Scope::User);
        assert!(
            unit.contains("ExecStart=/opt/minions-worker --nats nats://h:4222 --name \"a b\"\n"),
            "{unit}"
        );
        assert!(unit.contains("Nice=19") && unit.contains("KillSignal=SIGTERM"));
        let plist = launchd_plist(
            Path::new("/opt/minions-worker"),
            &args,
            Path::new("/tmp/l.log"),
            &Scope::User,
        );
        assert!(
            plist.contains("<string>a b</string>") && plist.contains("<string>Background</string>"),
            "{plist}"
        );
        assert_eq!(
            plist.matches("<dict>").count(),
            plist.matches("</dict>").count()
        );
    }

    /// `systemd-analyze verify` of a unit file `text` (named
    /// minions-worker.service in a scratch folder): its warnings (empty
    /// when clean). None when systemd-analyze is not installed.
    fn systemd_verify(text: &str) -> Result<Option<String>, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let unit = dir.path().join("minions-worker.service");
        std::fs::write(&unit, text)?;
        let out = match std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(&unit)
            .output()
        {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut said = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            said.push_str(&format!("\nexit: {}", out.status));
        }
        Ok(Some(said.trim().to_owned()))
    }

    /// The unit passes systemd's own check without a warning (its program
    /// must exist: this test's binary stands in), and the check does catch
    /// a key systemd does not know.
    #[test]
    fn systemd_verifies_the_unit() -> Result<(), Box<dyn std::error::Error>> {
        let program = std::env::current_exe()?;
        let args = vec!["--nats".to_owned(), "nats://h:4222".to_owned()];
        let unit = systemd_unit(&program, &args, &Scope::User);
        let Some(said) = systemd_verify(&unit)? else {
            eprintln!("systemd-analyze is not installed: the unit is not verified here");
            return Ok(());
        };
        assert_eq!(said, "", "systemd-analyze verify:\n{unit}");
        // The machine's unit, run as an account Debian has (systemd warns of "nobody").
        let system = systemd_unit(
            &program,
            &args,
            &Scope::System {
                run_as: Some("daemon".into()),
            },
        );
        assert!(system.contains("User=daemon\n") && system.contains("WantedBy=multi-user.target"));
        assert!(system.contains("CacheDirectory=minions-worker\n"));
        let said = systemd_verify(&system)?.unwrap_or_default();
        assert_eq!(said, "", "systemd-analyze verify:\n{system}");
        let typo = unit.replace("Nice=19", "Nicee=19");
        let said = systemd_verify(&typo)?.unwrap_or_default();
        assert!(said.contains("Nicee"), "a wrong key passes: {said:?}");
        Ok(())
    }

    /// The plist is a property list (read by Python's plistlib, which
    /// refuses malformed ones) with the keys launchd needs.
    #[test]
    fn the_plist_is_a_property_list_with_launchds_keys() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("agent.plist");
        let args = vec!["--name".to_owned(), "a <b> & \"c\"".to_owned()];
        std::fs::write(
            &path,
            launchd_plist(
                Path::new("/opt/minions-worker"),
                &args,
                Path::new("/tmp/l.log"),
                &Scope::System {
                    run_as: Some("_minions".into()),
                },
            ),
        )?;
        let script =
            "import json, plistlib, sys\nprint(json.dumps(plistlib.load(open(sys.argv[1], 'rb'))))";
        let out = match std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .output()
        {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("python3 is not installed: the plist is not parsed here");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        assert!(
            out.status.success(),
            "plistlib: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let d: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(d["Label"], LAUNCHD_LABEL);
        assert_eq!(
            d["ProgramArguments"],
            serde_json::json!(["/opt/minions-worker", "--name", "a <b> & \"c\""])
        );
        assert_eq!(d["RunAtLoad"], true);
        assert_eq!(d["KeepAlive"]["SuccessfulExit"], false);
        assert_eq!(d["ProcessType"], "Background");
        assert_eq!(
            (d["Nice"].as_i64(), d["ExitTimeOut"].as_i64()),
            (Some(19), Some(45))
        );
        assert_eq!(d["StandardErrorPath"], "/tmp/l.log");
        assert_eq!(d["UserName"], "_minions");
        Ok(())
    }
}
