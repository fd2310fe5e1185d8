//! MessagePack encoding and bounded, versioned decoding.
//!
//! Every document carries its schema version in a field named `v`. Decoding
//! checks the byte length against a limit first, then the nesting depth, then
//! the version, and only then the full shape, so each failure names its cause.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::SCHEMA_VERSION;
use crate::limits::MAX_DEPTH;

/// Why a document could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The bytes are longer than the limit for this kind of document.
    #[error("{what} is {size} bytes; the limit is {limit}")]
    TooLarge {
        /// What was being decoded.
        what: &'static str,
        /// Its size in bytes.
        size: usize,
        /// The limit it broke.
        limit: usize,
    },
    /// The document was written by another schema version.
    #[error("{what} has schema version {found}; this build reads version {supported} only")]
    UnsupportedVersion {
        /// What was being decoded.
        what: &'static str,
        /// The version found in the document.
        found: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// The bytes are not a valid document of this kind.
    #[error("{what} does not decode: {source}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// The decoder's complaint.
        #[source]
        source: rmp_serde::decode::Error,
    },
    /// The value could not be encoded (a bug, never caused by input).
    #[error("{what} does not encode: {source}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoder's complaint.
        #[source]
        source: rmp_serde::encode::Error,
    },
}

/// Encodes `value` as MessagePack with named fields (readers ignore fields they
/// do not know, so optional fields can be added without a version bump).
pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    rmp_serde::to_vec_named(value).map_err(|source| CodecError::Encode { what, source })
}

#[derive(serde::Deserialize)]
struct VersionProbe {
    v: u16,
}

fn from_slice<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
    de.set_max_depth(MAX_DEPTH);
    T::deserialize(&mut de).map_err(|source| CodecError::Malformed { what, source })
}

/// Decodes a document of kind `what` from untrusted `bytes`.
///
/// Refuses more than `limit` bytes before looking at them, nesting deeper than
/// [`MAX_DEPTH`], and any schema version but [`SCHEMA_VERSION`].
pub fn decode<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
    limit: usize,
) -> Result<T, CodecError> {
    if bytes.len() > limit {
        return Err(CodecError::TooLarge {
            what,
            size: bytes.len(),
            limit,
        });
    }
    let probe: VersionProbe = from_slice(what, bytes)?;
    if probe.v != SCHEMA_VERSION {
        return Err(CodecError::UnsupportedVersion {
            what,
            found: probe.v,
            supported: SCHEMA_VERSION,
        });
    }
    from_slice(what, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Doc {
        v: u16,
        name: String,
    }

    #[test]
    fn round_trips() -> Result<(), CodecError> {
        let d = Doc {
            v: SCHEMA_VERSION,
            name: "x".into(),
        };
        let b = encode("doc", &d)?;
        assert_eq!(decode::<Doc>("doc", &b, 1024)?, d);
        Ok(())
    }

    #[test]
    fn refuses_oversized_before_decoding() {
        let r = decode::<Doc>("doc", &[0u8; 100], 10);
        assert!(matches!(
            r,
            Err(CodecError::TooLarge {
                size: 100,
                limit: 10,
                ..
            })
        ));
    }

    #[test]
    fn refuses_other_versions() -> Result<(), CodecError> {
        let b = encode(
            "doc",
            &Doc {
                v: 9,
                name: "x".into(),
            },
        )?;
        let err = decode::<Doc>("doc", &b, 1024).err();
        assert!(matches!(
            err,
            Some(CodecError::UnsupportedVersion { found: 9, .. })
        ));
        assert!(
            err.map(|e| e.to_string())
                .unwrap_or_default()
                .contains("version 9")
        );
        Ok(())
    }

    #[test]
    fn refuses_garbage_and_deep_nesting() {
        assert!(matches!(
            decode::<Doc>("doc", b"\xc1\xc1", 1024),
            Err(CodecError::Malformed { .. })
        ));
        // 1000 nested one-element arrays.
        let mut deep = vec![0x91u8; 1000];
        deep.push(0x01);
        assert!(decode::<Doc>("doc", &deep, 4096).is_err());
    }
}
