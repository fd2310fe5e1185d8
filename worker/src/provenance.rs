//! What this worker records as the maker of its outputs: its build (the
//! version and a digest of its own executable, so that two builds of one
//! version differ), its device and its CPU kernel path (`device` on the
//! device path, where none of our CPU kernels runs).

use minions_schemas::messages::Provenance;
use sha2::{Digest, Sha256};

/// Hex digits of the executable's SHA-256 kept in the build name.
const BUILD_DIGEST_HEX: usize = 12;

/// This process's provenance on `device`, its models on `path`. The
/// executable is read once, at start; when it cannot be read the build is
/// the version alone.
pub(crate) async fn detect(device: &str, path: minions_engine::EnginePath) -> Provenance {
    let digest = tokio::task::spawn_blocking(exe_digest).await.ok().flatten();
    Provenance {
        build: build_name(env!("CARGO_PKG_VERSION"), digest.as_deref()),
        device: device.to_owned(),
        kernel: match path {
            minions_engine::EnginePath::Fast => minions_engine::CpuPath::get().name().to_owned(),
            minions_engine::EnginePath::Device => {
                minions_schemas::messages::DEVICE_PATH_KERNEL.to_owned()
            }
        },
    }
}

/// `version+digest`, or the version alone without a digest.
fn build_name(version: &str, digest: Option<&str>) -> String {
    match digest {
        Some(d) => format!("{version}+{}", &d[..d.len().min(BUILD_DIGEST_HEX)]),
        None => version.to_owned(),
    }
}

/// The SHA-256 of the running executable, hex.
fn exe_digest() -> Option<String> {
    let path = std::env::current_exe().ok()?;
    let mut file = std::fs::File::open(&path).ok()?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).ok()?;
    Some(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_name_is_the_version_and_a_short_digest() {
        assert_eq!(
            build_name("0.1.0", Some("3fa2c81b09de77aa")),
            "0.1.0+3fa2c81b09de"
        );
        assert_eq!(build_name("0.1.0", None), "0.1.0");
    }

    #[test]
    fn the_running_executable_has_a_digest() {
        let d = exe_digest().unwrap_or_default();
        assert_eq!(d.len(), 64, "{d}");
    }
}
