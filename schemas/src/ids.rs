//! Validated identifiers.
//!
//! Subjects and object keys are built only from these types, so a hostile
//! message cannot reach another job's keys or inject subject tokens. The safe
//! alphabet is ASCII letters, digits, `-` and `_`; ids start with a letter or
//! digit and are at most [`MAX_ID_LEN`] bytes long.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest accepted identifier, in bytes.
pub const MAX_ID_LEN: usize = 64;

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The string is empty.
    #[error("{kind} is empty")]
    Empty {
        /// Which kind of id was being checked.
        kind: &'static str,
    },
    /// The string is longer than [`MAX_ID_LEN`].
    #[error("{kind} {value:?} is {len} bytes long; at most {MAX_ID_LEN} are allowed")]
    TooLong {
        /// Which kind of id was being checked.
        kind: &'static str,
        /// The offending value, cut to a readable length.
        value: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The string has a character outside the safe alphabet.
    #[error(
        "{kind} {value:?} has {bad:?}; ids use letters, digits, '-' and '_', and start with a letter or digit"
    )]
    BadChar {
        /// Which kind of id was being checked.
        kind: &'static str,
        /// The offending value.
        value: String,
        /// The first character that is not allowed.
        bad: char,
    },
}

/// Checks `value` against the safe id alphabet.
pub fn validate(kind: &'static str, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if value.len() > MAX_ID_LEN {
        let shown: String = value.chars().take(MAX_ID_LEN).collect();
        return Err(IdError::TooLong {
            kind,
            value: shown,
            len: value.len(),
        });
    }
    for (i, c) in value.chars().enumerate() {
        let ok = c.is_ascii_alphanumeric() || (i > 0 && (c == '-' || c == '_'));
        if !ok {
            return Err(IdError::BadChar {
                kind,
                value: value.to_owned(),
                bad: c,
            });
        }
    }
    Ok(())
}

macro_rules! safe_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        safe_id!($(#[$doc])* $name, $kind, validate);
    };
    ($(#[$doc:meta])* $name:ident, $kind:literal, $check:path) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Validates `value` and wraps it.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                $check($kind, &value)?;
                Ok(Self(value))
            }

            /// The id as a string slice (always in the safe alphabet).
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

safe_id!(
    /// A job id: names the job in subjects, message ids and object keys.
    JobId,
    "job id"
);
safe_id!(
    /// A worker id: one per worker process session (a restarted worker gets a new one).
    WorkerId,
    "worker id"
);
safe_id!(
    /// A model name: a mutable tag in the store that points at a [`ModelHash`].
    ModelName,
    "model name"
);

/// Checks that `value` is 64 lowercase hex digits (a SHA-256).
fn validate_hash(kind: &'static str, value: &str) -> Result<(), IdError> {
    if value.len() != 64 {
        return Err(IdError::TooLong {
            kind,
            len: value.len(),
            value: value.chars().take(MAX_ID_LEN).collect(),
        });
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_digit() || ('a'..='f').contains(c)))
    {
        return Err(IdError::BadChar {
            kind,
            value: value.to_owned(),
            bad,
        });
    }
    Ok(())
}

safe_id!(
    /// A model's content hash: 64 lowercase hex digits (SHA-256 of its manifest).
    ModelHash,
    "model hash",
    validate_hash
);

impl ModelHash {
    /// The first 12 hex digits, for logs and listings.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_safe_ids() {
        for ok in ["a", "job-1", "J_2024_x", "0abc"] {
            assert!(JobId::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_unsafe_ids() {
        for bad in ["", "-a", "_a", "a.b", "a/b", "a b", "a*", "a>", "é"] {
            assert!(JobId::new(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            JobId::new("x".repeat(65)),
            Err(IdError::TooLong { len: 65, .. })
        ));
    }

    #[test]
    fn model_hash_is_64_lower_hex() {
        let h = "ab".repeat(32);
        assert_eq!(ModelHash::new(h.clone()).map(|m| m.short().len()), Ok(12));
        assert!(ModelHash::new(h.to_uppercase()).is_err());
        assert!(ModelHash::new("abc").is_err());
    }

    #[test]
    fn decode_rejects_bad_ids() {
        let bytes = rmp_serde::to_vec(&"a/../b").unwrap_or_default();
        let r: Result<JobId, _> = rmp_serde::from_slice(&bytes);
        assert!(r.is_err());
    }
}
