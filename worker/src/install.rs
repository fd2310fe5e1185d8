//! `minions-worker install` and `uninstall`: write the service file
//! ([`crate::service`]), start the service, then wait for the worker it
//! runs to record its start ([`crate::start_record`]) and say what came of
//! it: the canary's verdict, or the error that stopped the worker, and where
//! the logs are. A service that starts but never lends is said at once, not
//! found out days later.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::service::{self, Scope, ServiceError};
use crate::start_record;

/// How often the start record is looked at while waiting.
const POLL: Duration = Duration::from_millis(200);

/// What `install` was asked to do.
#[derive(Debug, Clone)]
pub struct InstallRequest {
    /// Folder for the service file; None: the platform's.
    pub unit_dir: Option<PathBuf>,
    /// Write the file only.
    pub no_start: bool,
    /// Whose service.
    pub scope: Scope,
    /// How long to wait for the worker's canary (zero: do not wait).
    pub wait: Duration,
    /// The worker flags the service runs with.
    pub args: Vec<String>,
    /// `--cache-dir` as given, if it was.
    pub cache_dir: Option<PathBuf>,
}

/// The cache folder the service's worker uses: the one given (it must be
/// absolute: a service does not start where the installer stood), else a
/// system folder for a machine's service, else this user's default.
fn cache_dir_of(request: &InstallRequest) -> Result<PathBuf, ServiceError> {
    match &request.cache_dir {
        Some(dir) if dir.is_absolute() => Ok(dir.clone()),
        Some(dir) => Err(ServiceError::RelativeCacheDir(dir.display().to_string())),
        None if matches!(request.scope, Scope::System { .. }) => Ok(service::system_cache_dir()),
        None => Ok(crate::config::default_cache_dir()),
    }
}

/// True when `flag` is among `args` (`--flag VALUE` or `--flag=VALUE`).
fn given(args: &[String], flag: &str) -> bool {
    args.iter()
        .any(|a| a == flag || a.strip_prefix(flag).is_some_and(|v| v.starts_with('=')))
}

/// The worker's environment variables set here whose flag is not among
/// `args`: (variable, flag). The service would run without them. The
/// cache folder is left out: it is pinned as a flag.
fn env_not_carried(args: &[String]) -> Vec<(String, String)> {
    let command = <crate::cli::WorkerArgs as clap::CommandFactory>::command();
    command
        .get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_str()?.to_owned();
            let flag = format!("--{}", a.get_long()?);
            (std::env::var_os(&env).is_some() && !given(args, &flag) && flag != "--cache-dir")
                .then_some((env, flag))
        })
        .collect()
}

/// Installs the service, starts it unless asked not to, and waits for its
/// worker's verdict. Returns what to tell the user; an error when the
/// worker stopped or gave no verdict in time.
pub async fn install(request: &InstallRequest) -> Result<String, ServiceError> {
    let scope = &request.scope;
    let dir = match &request.unit_dir {
        Some(d) => d.clone(),
        None => service::default_dir(scope)?,
    };
    let cache_dir = cache_dir_of(request)?;
    let mut args = request.args.clone();
    for (env, flag) in env_not_carried(&args) {
        tracing::warn!(env = %env, flag = %flag,
            "set in this shell, but a service does not see this shell's environment: pass it as the flag instead");
    }
    if !given(&args, "--cache-dir") {
        // Pinned, so the installer reads the record where the service writes it.
        args.push("--cache-dir".into());
        args.push(cache_dir.display().to_string());
    }
    let me = std::env::current_exe().map_err(|source| ServiceError::Io {
        path: "the running program".into(),
        source,
    })?;
    let asked_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let path = service::install(&dir, &me, &args, request.no_start, scope)?;
    let whose = match scope {
        Scope::User => "a service of this user".to_owned(),
        Scope::System { run_as: None } => "a service of this machine, run as root".to_owned(),
        Scope::System { run_as: Some(u) } => format!("a service of this machine, run as {u}"),
    };
    let logs = service::logs_hint(scope);
    if request.no_start {
        return Ok(format!(
            "installed {} ({whose}); not started (--no-start)\n",
            path.display()
        ));
    }
    let mut said = format!("installed {} ({whose}) and started it\n", path.display());
    if request.wait.is_zero() {
        said.push_str(&format!(
            "not waiting for its canary (--wait 0)\nlogs: {logs}\n"
        ));
        return Ok(said);
    }
    tracing::info!(wait_s = request.wait.as_secs(), record = %start_record::path(&cache_dir).display(),
        "waiting for the worker's canary");
    let deadline = Instant::now() + request.wait;
    loop {
        if let Some(r) = start_record::read(&cache_dir).filter(|r| r.at_ms >= asked_at) {
            if !r.passed {
                return Err(ServiceError::Stopped {
                    detail: r.detail,
                    logs,
                });
            }
            said.push_str(&format!("{}\nlogs: {logs}\n", r.detail));
            return Ok(said);
        }
        if Instant::now() >= deadline {
            return Err(ServiceError::NoVerdict {
                waited_s: request.wait.as_secs(),
                record: start_record::path(&cache_dir).display().to_string(),
                logs,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Stops (unless `no_stop`) and removes the service in `unit_dir` (None:
/// the platform's folder). Returns what to tell the user.
pub fn uninstall(
    unit_dir: Option<&Path>,
    no_stop: bool,
    scope: &Scope,
) -> Result<String, ServiceError> {
    let dir = match unit_dir {
        Some(d) => d.to_owned(),
        None => service::default_dir(scope)?,
    };
    Ok(match service::uninstall(&dir, no_stop, scope)? {
        Some(p) => format!("removed {}\n", p.display()),
        None => format!("no worker service installed in {}\n", dir.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(scope: Scope, cache_dir: Option<&str>) -> InstallRequest {
        InstallRequest {
            unit_dir: None,
            no_start: true,
            scope,
            wait: Duration::ZERO,
            args: Vec::new(),
            cache_dir: cache_dir.map(PathBuf::from),
        }
    }

    #[test]
    fn flags_are_found_in_both_spellings() {
        let args: Vec<String> = ["--nats", "nats://h", "--store=file:///s"]
            .map(String::from)
            .into();
        assert!(given(&args, "--nats") && given(&args, "--store"));
        assert!(!given(&args, "--name") && !given(&args, "--nats-ca"));
    }

    #[test]
    fn the_cache_folder_is_absolute_and_a_machines_service_has_its_own() {
        let system = Scope::System { run_as: None };
        assert_eq!(
            cache_dir_of(&request(system.clone(), None)).ok(),
            Some(service::system_cache_dir())
        );
        assert_eq!(
            cache_dir_of(&request(system, Some("/srv/c"))).ok(),
            Some(PathBuf::from("/srv/c"))
        );
        let relative = cache_dir_of(&request(Scope::User, Some("cache")));
        assert!(
            matches!(&relative, Err(ServiceError::RelativeCacheDir(d)) if d == "cache"),
            "{relative:?}"
        );
    }

    /// Installing without starting writes the file with the cache folder
    /// pinned, and says it did not start it.
    #[tokio::test]
    async fn not_started_says_so_and_pins_the_cache() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut r = request(Scope::User, None);
        r.unit_dir = Some(dir.path().to_owned());
        r.args = vec!["--nats".into(), "nats://h:4222".into()];
        let said = install(&r).await?;
        assert!(said.contains("not started (--no-start)"), "{said}");
        let written = std::fs::read_dir(dir.path())?
            .next()
            .ok_or("no service file")??
            .path();
        let text = std::fs::read_to_string(written)?;
        assert!(text.contains("--nats nats://h:4222 --cache-dir "), "{text}");
        let gone = uninstall(Some(dir.path()), true, &Scope::User)?;
        assert!(gone.starts_with("removed "), "{gone}");
        Ok(())
    }
}
