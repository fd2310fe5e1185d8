//! What `minions admin add-worker` and `add-producer` share: a fresh nkey
//! pair whose seed is written to a file readable by its owner only (never
//! over an existing file), and a server config entry inserted above the
//! marker line of `deploy/nats/least-privilege.conf`, the config rewritten
//! through a temporary file and a rename so it is never left half-written.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The line of the server config above which entries are inserted.
pub const MARKER: &str = "# minions: new worker identities go above this line";

/// Why an identity could not be added.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The name cannot be an identity's.
    #[error(
        "{0:?} cannot name {1}: use letters, digits and `-`, start with a letter or digit, at most 40 characters{2}"
    )]
    BadName(String, &'static str, String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The config lacks the marker line.
    #[error(
        "{0}: no line `{MARKER}` to insert the identity above (start from deploy/nats/least-privilege.conf)"
    )]
    NoMarker(PathBuf),
    /// The name already has an identity.
    #[error(
        "{0}: {1} already has an identity; delete its entry (the lines from `# {1} (` to the next entry) to issue a new one"
    )]
    Exists(PathBuf, String),
    /// The seed file exists (never overwritten: it may be in use).
    #[error("{0} exists; choose another --seed-out or remove it first")]
    SeedExists(PathBuf),
    /// The key pair could not be made.
    #[error("making an nkey: {0}")]
    Key(String),
    /// A flag's value is not usable.
    #[error("{0}")]
    Flag(String),
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> IdentityError + '_ {
    move |source| IdentityError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The config `conf` with `entry` (whose first line is `# LABEL (...)`)
/// above the marker line; refused if `label` has an entry already. Nothing
/// is written.
pub(crate) fn read_with_entry(
    conf: &Path,
    label: &str,
    entry: impl FnOnce() -> String,
) -> Result<(String, usize), IdentityError> {
    let text = std::fs::read_to_string(conf).map_err(io(conf))?;
    let Some(at) = text.find(MARKER) else {
        return Err(IdentityError::NoMarker(conf.to_owned()));
    };
    if text.contains(&format!("# {label} (")) {
        return Err(IdentityError::Exists(conf.to_owned(), label.to_owned()));
    }
    // Insert at the start of the marker's line, keeping its indentation after.
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let mut updated = String::with_capacity(text.len() + 2048);
    updated.push_str(&text[..line_start]);
    updated.push_str(&entry());
    updated.push_str(&text[line_start..]);
    Ok((updated, line_start))
}

/// Makes a user nkey pair and writes its seed to `seed_file` (owner-only,
/// never over a file). Returns the public key.
pub(crate) fn new_seed(seed_file: &Path) -> Result<String, IdentityError> {
    let pair = nkeys::KeyPair::new_user();
    let seed = pair.seed().map_err(|e| IdentityError::Key(e.to_string()))?;
    write_secret(seed_file, &format!("{seed}\n"))?;
    Ok(pair.public_key())
}

/// Replaces `conf` with `text` through a temporary file and a rename.
pub(crate) fn replace(conf: &Path, text: &str) -> Result<(), IdentityError> {
    let tmp = conf.with_extension("conf.tmp");
    std::fs::write(&tmp, text).map_err(io(&tmp))?;
    std::fs::rename(&tmp, conf).map_err(io(conf))
}

fn write_secret(path: &Path, text: &str) -> Result<(), IdentityError> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let mut f = match o.open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(IdentityError::SeedExists(path.to_owned()));
        }
        Err(e) => return Err(io(path)(e)),
    };
    f.write_all(text.as_bytes()).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

/// The seed file's name, for the commands a report shows.
pub(crate) fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    )
}
