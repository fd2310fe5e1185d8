//! Scratch dirs for a test's logs, stores and caches.

use crate::Result;

/// Makes a scratch dir; with `MINIONS_KEEP_TEST_DIRS=1` it survives the test
/// (its path is printed) so logs can be read afterwards.
pub fn scratch(prefix: &str) -> Result<tempfile::TempDir> {
    let mut b = tempfile::Builder::new();
    b.prefix(prefix);
    if std::env::var_os("MINIONS_KEEP_TEST_DIRS").is_some() {
        b.disable_cleanup(true);
    }
    let d = b.tempdir()?;
    if std::env::var_os("MINIONS_KEEP_TEST_DIRS").is_some() {
        eprintln!("keeping {}", d.path().display());
    }
    Ok(d)
}
