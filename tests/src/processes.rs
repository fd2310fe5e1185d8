//! Child processes of a test: started with their output in a log file,
//! signalled, waited for, killed on drop; and reading those logs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// Lines of the log at `log` that contain `needle` (0 when it cannot be read).
pub fn log_count(log: &Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

/// The number after `key=` on the last line of the log at `log` that
/// contains `needle` (None when there is none).
pub fn log_value(log: &Path, needle: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().rev().find(|l| l.contains(needle))?;
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
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
