//! Who may read the dashboard and `/metrics`, and who may act from it: the
//! access file that `minions admin add-viewer` / `add-operator` write and
//! the watchdog's HTTP server reads (`--http-access FILE`), and the
//! credentials a request carries (a bearer token, the sign-in cookie, or a
//! trusted proxy's user header).
//!
//! One entry per line; `#` starts a comment:
//!
//! ```text
//! token viewer ana 3f1c…(64 hex: SHA-256 of the token)
//! token operator ops-oncall 9ab0…
//! token metrics prometheus 51d2…
//! user operator bob          # a user a trusted proxy names (default: viewer)
//! ```
//!
//! Only a token's SHA-256 is kept: the file gives nothing away. Tokens are
//! 32 random bytes, so a fast hash is enough (nothing to guess).

use std::collections::HashMap;

use sha2::{Digest, Sha256};

/// What a credential lets its holder do. Ordered: each can do what the
/// ones before it can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// `/metrics` only (a Prometheus scraper).
    Metrics,
    /// Every page and API read, no action.
    Viewer,
    /// Also the actions that change the fleet.
    Operator,
}

impl Role {
    /// The word in the access file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Metrics => "metrics",
            Self::Viewer => "viewer",
            Self::Operator => "operator",
        }
    }

    /// Parses the access file's word.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "metrics" => Some(Self::Metrics),
            "viewer" => Some(Self::Viewer),
            "operator" => Some(Self::Operator),
            _ => None,
        }
    }
}

/// Who a request is, once its credential checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    /// The name it was issued to (or the proxy's user).
    pub name: String,
    /// What it may do.
    pub role: Role,
}

/// The prefix of every token (so a leaked one is recognisable).
pub const TOKEN_PREFIX: &str = "mnt_";
/// A token's length: the prefix and 64 hex digits.
pub const TOKEN_LEN: usize = TOKEN_PREFIX.len() + 64;
/// The longest access file read.
pub const MAX_ACCESS_FILE_BYTES: usize = 1024 * 1024;
/// The longest user name a proxy header may carry.
pub const MAX_USER_LEN: usize = 256;
/// The sign-in cookie's name.
pub const COOKIE: &str = "minions_token";

/// A token made from 32 random bytes.
pub fn token_from(random: &[u8; 32]) -> String {
    format!("{TOKEN_PREFIX}{}", hex::encode(random))
}

/// The SHA-256 of `token`, as the access file keeps it (lowercase hex).
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The access file's line for a token.
pub fn token_line(role: Role, name: &str, token: &str) -> String {
    format!("token {} {name} {}\n", role.as_str(), token_hash(token))
}

/// Whether `name` may name an entry: 1–64 ASCII letters, digits, `-`,
/// `_`, `.` or `@`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
}

/// Why an access file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// A line does not read.
    #[error("line {line}: {problem}")]
    Line {
        /// 1-based.
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// Too big to be one.
    #[error("{0} bytes, over the limit of {MAX_ACCESS_FILE_BYTES}")]
    TooBig(usize),
}

/// The parsed access file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessList {
    /// By token hash (hex).
    tokens: HashMap<String, Who>,
    /// Proxy users with a role of their own.
    users: HashMap<String, Role>,
}

impl AccessList {
    /// Parses the text of an access file; the error names the line.
    pub fn parse(text: &str) -> Result<Self, AccessError> {
        if text.len() > MAX_ACCESS_FILE_BYTES {
            return Err(AccessError::TooBig(text.len()));
        }
        let mut list = Self::default();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |problem: String| AccessError::Line {
                line: i + 1,
                problem,
            };
            let words: Vec<&str> = line.split_whitespace().collect();
            let role = |w: &str| {
                Role::parse(w).ok_or_else(|| {
                    bad(format!(
                        "role {w:?} is not one of metrics, viewer, operator"
                    ))
                })
            };
            let name = |w: &str| {
                if valid_name(w) {
                    Ok(w.to_owned())
                } else {
                    Err(bad(format!(
                        "name {w:?}: use 1-64 letters, digits, '-', '_', '.', '@'"
                    )))
                }
            };
            match words.as_slice() {
                ["token", r, n, h] => {
                    let (role, name) = (role(r)?, name(n)?);
                    if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(bad("a token's hash is 64 hex digits".into()));
                    }
                    list.tokens
                        .insert(h.to_ascii_lowercase(), Who { name, role });
                }
                ["user", r, n] => {
                    let (role, name) = (role(r)?, name(n)?);
                    list.users.insert(name, role);
                }
                _ => {
                    return Err(bad(
                        "expected `token ROLE NAME SHA256` or `user ROLE NAME`".into()
                    ));
                }
            }
        }
        Ok(list)
    }

    /// Who holds `token`, if anyone.
    pub fn by_token(&self, token: &str) -> Option<&Who> {
        self.tokens.get(&token_hash(token))
    }

    /// The role of a user a trusted proxy names: its own line's, else
    /// viewer.
    pub fn user_role(&self, user: &str) -> Role {
        self.users.get(user).copied().unwrap_or(Role::Viewer)
    }

    /// Whether `name` has a token already.
    pub fn has_token_for(&self, name: &str) -> bool {
        self.tokens.values().any(|w| w.name == name)
    }
}

/// The token of an `Authorization` header value (`Bearer TOKEN`, the
/// scheme in any case), if it is one of ours.
pub fn bearer(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    well_formed(token.trim())
}

/// The token of a `Cookie` header value, if it holds our cookie.
pub fn cookie_token(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?;
    value.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        if k.trim() == COOKIE {
            well_formed(v.trim())
        } else {
            None
        }
    })
}

/// `token` if it has a token's shape.
pub fn well_formed(token: &str) -> Option<&str> {
    (token.len() == TOKEN_LEN
        && token.starts_with(TOKEN_PREFIX)
        && token[TOKEN_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit()))
    .then_some(token)
}

/// The user a trusted proxy's header names, if it is a usable name
/// (printable ASCII without spaces, at most [`MAX_USER_LEN`]).
pub fn proxy_user(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?.trim();
    (!value.is_empty()
        && value.len() <= MAX_USER_LEN
        && value.bytes().all(|b| b.is_ascii_graphic()))
    .then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_kept_hashed_and_found_by_their_holder() -> Result<(), AccessError> {
        let t = token_from(&[7; 32]);
        assert_eq!(t.len(), TOKEN_LEN);
        let text = format!(
            "# who may see\n{}user operator bob\n\n{}",
            token_line(Role::Viewer, "ana", &t),
            token_line(Role::Metrics, "prom", &token_from(&[9; 32]))
        );
        assert!(!text.contains(&t[TOKEN_PREFIX.len()..]));
        let list = AccessList::parse(&text)?;
        assert_eq!(
            list.by_token(&t),
            Some(&Who {
                name: "ana".into(),
                role: Role::Viewer
            })
        );
        assert_eq!(list.by_token(&token_from(&[8; 32])), None);
        assert_eq!(list.user_role("bob"), Role::Operator);
        assert_eq!(list.user_role("carol"), Role::Viewer);
        assert!(list.has_token_for("prom") && !list.has_token_for("bob"));
        Ok(())
    }

    #[test]
    fn a_bad_line_is_named() {
        for (text, line) in [
            ("token boss ana 00", 1),
            ("\nuser viewer a b", 2),
            ("token viewer ana 00", 1),
            (
                "token viewer a/b 0000000000000000000000000000000000000000000000000000000000000000",
                1,
            ),
            ("tokens viewer ana", 1),
        ] {
            match AccessList::parse(text) {
                Err(AccessError::Line { line: l, .. }) => assert_eq!(l, line, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn credentials_are_read_from_headers() {
        let t = token_from(&[1; 32]);
        assert_eq!(bearer(format!("Bearer {t}").as_bytes()), Some(t.as_str()));
        assert_eq!(bearer(format!("bearer  {t} ").as_bytes()), Some(t.as_str()));
        assert_eq!(bearer(format!("Basic {t}").as_bytes()), None);
        assert_eq!(bearer(b"Bearer mnt_xyz"), None);
        let cookie = format!("theme=dark; {COOKIE}={t}; x=y");
        assert_eq!(cookie_token(cookie.as_bytes()), Some(t.as_str()));
        assert_eq!(cookie_token(b"theme=dark"), None);
        assert_eq!(proxy_user(b" ana@corp "), Some("ana@corp"));
        assert_eq!(proxy_user(b"ana corp"), None);
        assert_eq!(proxy_user(&[0xff, 0x41]), None);
    }
}
