//! Running the worker as a background service of the logged-in user:
//! `minions-worker install` writes and starts a systemd user unit on Linux or
//! a launchd LaunchAgent on macOS (background QoS, low I/O priority);
//! `uninstall` stops and removes it.

use std::path::{Path, PathBuf};

/// The systemd unit's file name.
pub const SYSTEMD_UNIT: &str = "minions-worker.service";
/// The launchd label (and plist file stem).
pub const LAUNCHD_LABEL: &str = "io.minions.worker";

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

/// The systemd user unit that runs `program args`.
pub fn systemd_unit(program: &Path, args: &[String]) -> String {
    let mut exec = shell_quote(&program.display().to_string());
    for a in args {
        exec.push(' ');
        exec.push_str(&shell_quote(a));
    }
    format!(
        "[Unit]\n\
         Description=Minions worker: lends this machine's GPU to the fleet while its owner is away\n\
         After=network-online.target\n\n\
         [Service]\n\
         ExecStart={exec}\n\
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
         WantedBy=default.target\n"
    )
}

/// The launchd LaunchAgent plist that runs `program args` in the background
/// QoS class with low I/O priority.
pub fn launchd_plist(program: &Path, args: &[String], log: &Path) -> String {
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
         </dict>\n</plist>\n"
    )
}

/// Where the service file goes by default on this platform.
pub fn default_dir() -> Result<PathBuf, ServiceError> {
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

/// Writes the service file into `dir` and, unless `no_start`, loads and
/// starts it. Returns the file written.
pub fn install(
    dir: &Path,
    program: &Path,
    args: &[String],
    no_start: bool,
) -> Result<PathBuf, ServiceError> {
    std::fs::create_dir_all(dir).map_err(|source| ServiceError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let (path, text) = if cfg!(target_os = "macos") {
        let log = dirs::home_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("Library/Logs/minions-worker.log");
        (
            dir.join(format!("{LAUNCHD_LABEL}.plist")),
            launchd_plist(program, args, &log),
        )
    } else {
        (dir.join(SYSTEMD_UNIT), systemd_unit(program, args))
    };
    std::fs::write(&path, text).map_err(|source| ServiceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    if !no_start {
        let p = path.display().to_string();
        if cfg!(target_os = "macos") {
            manager("launchctl", &["load", "-w", &p])?;
        } else {
            manager("systemctl", &["--user", "daemon-reload"])?;
            manager("systemctl", &["--user", "enable", "--now", SYSTEMD_UNIT])?;
        }
    }
    Ok(path)
}

/// Stops (unless `no_stop`) and removes the service file from `dir`.
/// Returns the file removed, if there was one.
pub fn uninstall(dir: &Path, no_stop: bool) -> Result<Option<PathBuf>, ServiceError> {
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
            manager("systemctl", &["--user", "disable", "--now", SYSTEMD_UNIT])?;
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
        let unit = systemd_unit(Path::new("/opt/minions-worker"), &args);
        assert!(
            unit.contains("ExecStart=/opt/minions-worker --nats nats://h:4222 --name \"a b\"\n"),
            "{unit}"
        );
        assert!(unit.contains("Nice=19") && unit.contains("KillSignal=SIGTERM"));
        let plist = launchd_plist(
            Path::new("/opt/minions-worker"),
            &args,
            Path::new("/tmp/l.log"),
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
}
