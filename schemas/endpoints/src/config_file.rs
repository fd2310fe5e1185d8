//! The connection settings file: where NATS and the store are and who this
//! program is to NATS, so that a machine's settings live in one file rather
//! than in flags or a service's environment.
//!
//! Every binary reads it from `--config FILE` or `MINIONS_CONFIG`, else
//! from `minions/config.toml` in the user's config dir when that exists.
//! Flags and environment variables win over the file, the file over
//! defaults. Credentials are one setting: if a flag or variable gives any of
//! `nats_creds`, `nats_nkey` or `nats_user`, the file's credentials are
//! ignored. Relative paths are relative to the file's folder.
//!
//! ```toml
//! nats = "tls://nats.office.example:4222"
//! store = "s3://minions-fleet"
//! nats_nkey = "mac-01.nk"
//! nats_ca = "ca.pem"
//! team = "search"          # minions submit's --team default
//! priority = "normal"      # and its --priority default
//! # The usage ledger (PostgreSQL): where minions-watchdog writes it
//! # (its --ledger) and where `minions usage` reads it. A password here
//! # means: keep the file readable by its owner only.
//! ledger = "postgres://minions@db.office.example/minions"
//! price_per_kwh = 0.30     # minions usage's --price-per-kwh default
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::nats::{DEFAULT_NATS_URL, NatsSecurity};

/// The largest settings file read (it holds a few paths).
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// The file's keys; each is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionFile {
    /// NATS server URL (`--nats`).
    pub nats: Option<String>,
    /// Object store URL (`--store`).
    pub store: Option<String>,
    /// NATS credentials file (`--nats-creds`).
    pub nats_creds: Option<PathBuf>,
    /// nkey seed file (`--nats-nkey`).
    pub nats_nkey: Option<PathBuf>,
    /// NATS user (`--nats-user`).
    pub nats_user: Option<String>,
    /// Password of `nats_user` (keep the file readable by its owner only).
    pub nats_password: Option<String>,
    /// Authorities to trust for the server's certificate (`--nats-ca`).
    pub nats_ca: Option<PathBuf>,
    /// Client certificate (`--nats-cert`).
    pub nats_cert: Option<PathBuf>,
    /// Client key (`--nats-key`).
    pub nats_key: Option<PathBuf>,
    /// Require TLS (`--nats-tls`).
    pub nats_tls: Option<bool>,
    /// The team `minions submit` uses without `--team`.
    pub team: Option<String>,
    /// The priority `minions submit` uses without `--priority`
    /// (`low`, `normal`, `high`).
    pub priority: Option<String>,
    /// The usage ledger's PostgreSQL URL: where `minions-watchdog` writes
    /// it (`--ledger`) and `minions usage` reads it.
    pub ledger: Option<String>,
    /// The energy price `minions usage` costs kWh at without
    /// `--price-per-kwh` (in whatever currency the reader thinks in).
    pub price_per_kwh: Option<f64>,
    /// The fleet's share of shards that `minions-watchdog` has checked by a
    /// second machine, for jobs submitted without `--verify` (`--verify`).
    pub verify: Option<f64>,
    /// The secret the fleet's watchdogs pick checked shards with
    /// (`MINIONS_VERIFY_KEY`); keep the file readable by its owner only.
    pub verify_key: Option<String>,
}

/// The result-checking defaults of the settings file in use (`--config`,
/// `MINIONS_CONFIG` or the user's), if any: `(verify, verify_key)`.
pub fn trust_defaults(
    explicit: Option<&Path>,
) -> Result<(Option<f64>, Option<String>), ConfigFileError> {
    match chosen(explicit) {
        Some(path) => {
            let f = read(&path)?;
            Ok((f.verify, f.verify_key))
        }
        None => Ok((None, None)),
    }
}

/// The submit defaults of the settings file in use (`--config`,
/// `MINIONS_CONFIG` or the user's), if any: team and priority.
pub fn submit_defaults(
    explicit: Option<&Path>,
) -> Result<(Option<String>, Option<String>), ConfigFileError> {
    match chosen(explicit) {
        Some(path) => {
            let f = read(&path)?;
            Ok((f.team, f.priority))
        }
        None => Ok((None, None)),
    }
}

/// What the settings file says about `minions usage`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageDefaults {
    /// The ledger's PostgreSQL URL (`ledger`).
    pub ledger: Option<String>,
    /// The energy price per kWh (`price_per_kwh`).
    pub price_per_kwh: Option<f64>,
}

/// The usage defaults of the settings file in use (`--config`,
/// `MINIONS_CONFIG` or the user's), if any: ledger URL and price per kWh.
pub fn usage_defaults(explicit: Option<&Path>) -> Result<UsageDefaults, ConfigFileError> {
    match chosen(explicit) {
        Some(path) => {
            let f = read(&path)?;
            Ok(UsageDefaults {
                ledger: f.ledger,
                price_per_kwh: f.price_per_kwh,
            })
        }
        None => Ok(UsageDefaults::default()),
    }
}

/// Why the settings file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// It could not be read.
    #[error("settings file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// It is larger than [`MAX_CONFIG_BYTES`].
    #[error(
        "settings file {path}: {size} bytes, more than the {MAX_CONFIG_BYTES} a settings file may have"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// It is not valid TOML or has an unknown key.
    #[error("settings file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong and where.
        message: String,
    },
}

/// The file to read: `explicit` (`--config`/`MINIONS_CONFIG`), else the
/// per-user default when it exists.
fn chosen(explicit: Option<&Path>) -> Option<PathBuf> {
    match explicit {
        Some(p) => Some(p.to_owned()),
        None => dirs::config_dir()
            .map(|d| d.join("minions").join("config.toml"))
            .filter(|p| p.is_file()),
    }
}

/// Reads and parses `path`, bounded by [`MAX_CONFIG_BYTES`].
pub fn read(path: &Path) -> Result<ConnectionFile, ConfigFileError> {
    let err = |source| ConfigFileError::Read {
        path: path.to_owned(),
        source,
    };
    let size = std::fs::metadata(path).map_err(err)?.len();
    if size > MAX_CONFIG_BYTES {
        return Err(ConfigFileError::TooLarge {
            path: path.to_owned(),
            size,
        });
    }
    let text = std::fs::read_to_string(path).map_err(err)?;
    let mut file: ConnectionFile = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        ConfigFileError::Parse {
            path: path.to_owned(),
            message: match line {
                Some(l) => format!("line {l}: {}", e.message().trim()),
                None => e.message().trim().to_owned(),
            },
        }
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    for p in [
        &mut file.nats_creds,
        &mut file.nats_nkey,
        &mut file.nats_ca,
        &mut file.nats_cert,
        &mut file.nats_key,
    ]
    .into_iter()
    .flatten()
    {
        if p.is_relative() {
            *p = base.join(&*p);
        }
    }
    Ok(file)
}

/// Fills what flags and environment variables left unset from the settings
/// file (see the module docs); returns the file used, if any. `nats` counts
/// as unset while it is the default URL and `MINIONS_NATS_URL` is unset.
pub fn apply(
    nats: &mut String,
    store: &mut Option<String>,
    security: &mut NatsSecurity,
) -> Result<Option<PathBuf>, ConfigFileError> {
    let Some(path) = chosen(security.config.as_deref()) else {
        return Ok(None);
    };
    let f = read(&path)?;
    if let Some(url) = f.nats
        && nats == DEFAULT_NATS_URL
        && std::env::var_os("MINIONS_NATS_URL").is_none()
    {
        *nats = url;
    }
    if store.is_none() {
        *store = f.store;
    }
    let s = security;
    if s.nats_creds.is_none() && s.nats_nkey.is_none() && s.nats_user.is_none() {
        s.nats_creds = f.nats_creds;
        s.nats_nkey = f.nats_nkey;
        s.nats_user = f.nats_user;
        if s.nats_password.is_none() {
            s.nats_password = f.nats_password;
        }
    }
    if s.nats_ca.is_none() {
        s.nats_ca = f.nats_ca;
    }
    if s.nats_cert.is_none() && s.nats_key.is_none() {
        s.nats_cert = f.nats_cert;
        s.nats_key = f.nats_key;
    }
    if !s.nats_tls {
        s.nats_tls = f.nats_tls.unwrap_or(false);
    }
    tracing::debug!(file = %path.display(), "connection settings file read");
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> std::io::Result<PathBuf> {
        let p = dir.join("config.toml");
        std::fs::write(&p, text)?;
        Ok(p)
    }

    #[test]
    fn the_file_fills_only_what_is_unset() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = write(
            dir.path(),
            "store = \"s3://b\"\nnats_nkey = \"mac.nk\"\nnats_ca = \"/etc/ca.pem\"\nnats_tls = true\n",
        )?;
        let mut nats = DEFAULT_NATS_URL.to_owned();
        let mut store = None;
        let mut s = NatsSecurity {
            config: Some(path.clone()),
            ..Default::default()
        };
        assert_eq!(apply(&mut nats, &mut store, &mut s)?, Some(path.clone()));
        assert_eq!(store.as_deref(), Some("s3://b"));
        assert_eq!(
            s.nats_nkey,
            Some(dir.path().join("mac.nk")),
            "relative to the file"
        );
        assert_eq!(s.nats_ca, Some(PathBuf::from("/etc/ca.pem")));
        assert!(s.nats_tls);
        // A flag's credential wins and keeps the file's out entirely.
        let mut store = Some("file:///x".to_owned());
        let mut s = NatsSecurity {
            config: Some(path),
            nats_user: Some("producer".into()),
            ..Default::default()
        };
        apply(&mut nats, &mut store, &mut s)?;
        assert_eq!((store.as_deref(), s.nats_nkey), (Some("file:///x"), None));
        Ok(())
    }

    #[test]
    fn bad_files_are_named_with_what_is_wrong() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = write(
            dir.path(),
            "nats = \"tls://x:4222\"\nnats_pasword = \"oops\"\n",
        )?;
        let e = read(&path)
            .err()
            .ok_or("accepted an unknown key")?
            .to_string();
        assert!(
            e.contains("nats_pasword") && e.contains("config.toml"),
            "{e}"
        );
        let path = write(dir.path(), &"#".repeat(70_000))?;
        assert!(matches!(read(&path), Err(ConfigFileError::TooLarge { .. })));
        let e = read(&dir.path().join("missing.toml"))
            .err()
            .ok_or("read nothing")?;
        assert!(e.to_string().contains("missing.toml"), "{e}");
        Ok(())
    }
}
