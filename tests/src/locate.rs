//! Finding programs: the workspace root, external tools (`nats-server`,
//! `moto_server`, ...) and the workspace's own built binaries.

use std::path::{Path, PathBuf};

use crate::Result;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Finds an external tool: `$env_var`, then `.tools/venv/bin/<name>`, then `PATH`.
pub fn tool(env_var: &str, name: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env_var) {
        return Ok(PathBuf::from(p));
    }
    let local = workspace_root().join(".tools/venv/bin").join(name);
    if local.is_file() {
        return Ok(local);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(format!(
        "{name} not found: set {env_var}, or run tests/run.sh which installs it into .tools/"
    )
    .into())
}

/// The path of one of the workspace's binaries, built next to the test
/// binary (or next to a bench binary of this crate).
pub fn bin(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> or target/<profile>/<bench> -> target/<profile>/<name>
    let mut dir = exe.parent().ok_or("cannot locate the target dir")?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().ok_or("cannot locate the target dir")?;
    }
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} is not built; run `cargo build --workspace` (cargo test --workspace builds it)",
            p.display()
        )
        .into())
    }
}
