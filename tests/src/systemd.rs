//! A private systemd for tests that start a real service: PID 1 of new PID,
//! mount, UTS and IPC namespaces, booted by `tests/systemd/boot.sh` so that
//! it starts nothing of the host's and writes only to its own tmpfs
//! folders. The network is the host's, so a service inside reaches the
//! test's nats-server on loopback. Dropping it kills everything inside.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{Result, workspace_root};

/// A booted private systemd.
pub struct PrivateSystemd {
    unshare: Child,
    /// PID 1 inside, as the host numbers it.
    pid1: u32,
    /// systemd's own console log.
    pub console: PathBuf,
}

/// The process whose parent is `parent`, if there is one now.
fn child_of(parent: u32) -> Option<u32> {
    let entries = std::fs::read_dir("/proc").ok()?;
    entries.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        // pid (comm) state ppid ...: comm may hold spaces, so after ')'.
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == parent).then_some(pid)
    })
}

impl PrivateSystemd {
    /// Why this machine cannot boot one, if it cannot: not Linux, not
    /// root, no systemd, or namespaces refused.
    pub fn unavailable() -> Option<String> {
        if !cfg!(target_os = "linux") {
            return Some("not Linux".into());
        }
        if !Path::new("/lib/systemd/systemd").exists() {
            return Some("systemd is not installed".into());
        }
        let probe = Command::new("unshare")
            .args(["--pid", "--fork", "--mount", "--uts", "--ipc", "true"])
            .stderr(Stdio::piped())
            .output();
        match probe {
            Ok(out) if out.status.success() => None,
            Ok(out) => Some(format!(
                "unshare refused new namespaces (root is needed): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Some(format!("unshare cannot run: {e}")),
        }
    }

    /// Boots one, its console log in `console`, and waits until it is
    /// up (at most `within`).
    pub fn boot(console: &Path, within: Duration) -> Result<Self> {
        let script = workspace_root().join("tests/systemd/boot.sh");
        let unshare = Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--mount",
                "--uts",
                "--ipc",
                "--propagation",
                "private",
            ])
            .arg(&script)
            .arg(console)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let started = Instant::now();
        let mut me = Self {
            pid1: 0,
            unshare,
            console: console.to_owned(),
        };
        loop {
            if me.pid1 == 0 {
                me.pid1 = child_of(me.unshare.id()).unwrap_or(0);
            }
            if me.pid1 != 0 {
                let up = me.run(&["systemctl", "is-system-running"])?;
                let state = String::from_utf8_lossy(&up.stdout).trim().to_owned();
                if state == "running" || state == "degraded" {
                    return Ok(me);
                }
            }
            if let Some(status) = me.unshare.try_wait()? {
                return Err(format!(
                    "the private systemd ended at boot ({status}):\n{}",
                    std::fs::read_to_string(console).unwrap_or_default()
                )
                .into());
            }
            if started.elapsed() > within {
                return Err(format!(
                    "the private systemd was not up within {within:?}:\n{}",
                    std::fs::read_to_string(console).unwrap_or_default()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `argv` inside (its namespaces), with this process's
    /// environment, and returns what it did.
    pub fn run(&self, argv: &[&str]) -> Result<Output> {
        Ok(Command::new("nsenter")
            .args(["-t", &self.pid1.to_string(), "-m", "-u", "-i", "-p", "--"])
            .args(argv)
            .stdin(Stdio::null())
            .output()?)
    }
}

impl Drop for PrivateSystemd {
    fn drop(&mut self) {
        if self.pid1 != 0 {
            // SIGKILL to PID 1 ends its namespace, and all inside.
            let _ = Command::new("kill")
                .args(["-KILL", &self.pid1.to_string()])
                .status();
        }
        // unshare reaps PID 1 and leaves; killed first, it would leave a
        // zombie behind.
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.unshare.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}
