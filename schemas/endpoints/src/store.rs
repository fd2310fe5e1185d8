//! Opening the object store from a URL.
//!
//! - `file:///abs/dir` or a plain path: a local directory (created if missing).
//! - `s3://bucket` or `s3://bucket/prefix`: S3 or any S3-compatible server,
//!   configured by the usual AWS variables (`AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL` for a custom
//!   endpoint, `AWS_ALLOW_HTTP=true` for a plain-http one). Create-only puts
//!   use `If-None-Match: *`.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;

/// A shared handle to the store.
pub type Store = Arc<dyn ObjectStore>;

/// Why a store URL could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    /// The URL's scheme is not supported.
    #[error(
        "store URL {url:?}: unsupported scheme {scheme:?}; use file:///path or s3://bucket[/prefix]"
    )]
    Scheme {
        /// The URL.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// The URL does not parse.
    #[error("store URL {url:?} does not parse: {source}")]
    Parse {
        /// The URL.
        url: String,
        /// The parser's complaint.
        #[source]
        source: url::ParseError,
    },
    /// The local directory cannot be created or opened.
    #[error("store directory {path}: {source}")]
    Dir {
        /// The directory.
        path: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The object_store backend refused the configuration.
    #[error("store {url:?}: {source}")]
    Backend {
        /// The URL.
        url: String,
        /// The backend's complaint.
        #[source]
        source: object_store::Error,
    },
}

/// The default store: `<data dir>/minions/store` (e.g.
/// `~/.local/share/minions/store` on Linux, `~/Library/Application
/// Support/minions/store` on macOS).
pub fn default_store_url() -> String {
    let base = dirs::data_dir().unwrap_or_else(std::env::temp_dir);
    format!("file://{}", base.join("minions").join("store").display())
}

/// Opens the store at `url` (see the module doc for the forms).
pub fn open(url: &str) -> Result<Store, StoreUrlError> {
    if url.starts_with("s3://") {
        return open_s3(url);
    }
    let path = if let Some(rest) = url.strip_prefix("file://") {
        PathBuf::from(rest)
    } else if url.contains("://") {
        let scheme = url.split("://").next().unwrap_or_default().to_owned();
        return Err(StoreUrlError::Scheme {
            url: url.to_owned(),
            scheme,
        });
    } else {
        PathBuf::from(url)
    };
    std::fs::create_dir_all(&path).map_err(|source| StoreUrlError::Dir {
        path: path.display().to_string(),
        source,
    })?;
    let fs = LocalFileSystem::new_with_prefix(&path).map_err(|source| StoreUrlError::Backend {
        url: url.to_owned(),
        source,
    })?;
    Ok(Arc::new(fs))
}

fn open_s3(url: &str) -> Result<Store, StoreUrlError> {
    let parsed = url::Url::parse(url).map_err(|source| StoreUrlError::Parse {
        url: url.to_owned(),
        source,
    })?;
    let bucket = parsed.host_str().unwrap_or_default().to_owned();
    let prefix = parsed.path().trim_matches('/').to_owned();
    // reqwest is built without a TLS backend of its own (Cargo.toml): it
    // takes the process default, ring.
    crate::nats::init_tls();
    let s3 = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .build()
        .map_err(|source| StoreUrlError::Backend {
            url: url.to_owned(),
            source,
        })?;
    if prefix.is_empty() {
        Ok(Arc::new(s3))
    } else {
        Ok(Arc::new(PrefixStore::new(s3, prefix)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_unknown_schemes() {
        let err = open("gopher://x")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("unsupported scheme"), "{err}");
    }

    #[test]
    fn opens_local_dirs() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("minions-store-test-{}", std::process::id()));
        let url = format!("file://{}", dir.display());
        let _store = open(&url)?;
        assert!(dir.is_dir());
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
