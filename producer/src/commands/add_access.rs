//! `minions admin add-viewer NAME` and `add-operator NAME`: a bearer token
//! for the watchdog's dashboard and `/metrics`. The token is printed once;
//! the access file (`minions-watchdog --http-access FILE`) keeps only its
//! SHA-256 beside the name and role ([`minions_schemas::access`]).

use std::io::Write as _;
use std::path::Path;

use minions_schemas::access::{self, AccessList, Role};

use super::identity_file::{IdentityError, io};

/// Makes a token for `name` with `role`, appends its line to `file`
/// (made, owner-only, when missing) and returns what to print: the token
/// and how to use it.
pub fn add(file: &Path, name: &str, role: Role) -> Result<String, IdentityError> {
    if !access::valid_name(name) {
        return Err(IdentityError::BadName(
            name.to_owned(),
            "a dashboard user",
            " ('_', '.' and '@' too, at most 64)".into(),
        ));
    }
    let existing = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io(file)(e)),
    };
    let list = AccessList::parse(&existing)
        .map_err(|e| IdentityError::Flag(format!("{}: {e}", file.display())))?;
    if list.has_token_for(name) {
        return Err(IdentityError::Exists(file.to_owned(), name.to_owned()));
    }
    let mut random = [0u8; 32];
    getrandom::fill(&mut random).map_err(|e| IdentityError::Key(e.to_string()))?;
    let token = access::token_from(&random);
    let mut o = std::fs::OpenOptions::new();
    o.append(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let mut f = o.open(file).map_err(io(file))?;
    let mut line = String::new();
    if !existing.is_empty() && !existing.ends_with('\n') {
        line.push('\n');
    }
    line.push_str(&access::token_line(role, name, &token));
    f.write_all(line.as_bytes()).map_err(io(file))?;
    f.sync_all().map_err(io(file))?;
    let what = match role {
        Role::Metrics => "reads /metrics only (Prometheus: `authorization: {credentials: TOKEN}`)",
        Role::Viewer => "reads the dashboard, its JSON and /metrics",
        Role::Operator => "reads everything and may act from the dashboard",
    };
    Ok(format!(
        "{token}\n{name} ({}) {what}. Shown once: only its SHA-256 is kept in {}; the watchdog reads it at start (--http-access {}). Send it as `Authorization: Bearer TOKEN`, or paste it at /signin.\n",
        role.as_str(),
        file.display(),
        file.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_printed_once_and_kept_hashed() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("access");
        let said = add(&file, "ana", Role::Viewer)?;
        let token = said.lines().next().ok_or("no token")?;
        let text = std::fs::read_to_string(&file)?;
        assert!(!text.contains(token));
        let list = AccessList::parse(&text)?;
        assert_eq!(list.by_token(token).map(|w| w.role), Some(Role::Viewer));
        add(&file, "ops", Role::Operator)?;
        assert!(matches!(
            add(&file, "ana", Role::Operator),
            Err(IdentityError::Exists(..))
        ));
        assert!(matches!(
            add(&file, "a b", Role::Viewer),
            Err(IdentityError::BadName(..))
        ));
        assert_eq!(std::fs::read_to_string(&file)?.lines().count(), 2);
        Ok(())
    }
}
