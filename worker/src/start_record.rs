//! What a worker's start came to, kept beside its model cache: the canary's
//! verdict, or the error that stopped the worker before it. A service
//! manager starts the worker out of sight; `minions-worker install` reads
//! this record to tell whoever installed it whether the machine now lends
//! (see the `install` module).
//!
//! One small JSON file per cache folder, replaced whole (written beside
//! and renamed), so a reader never sees half of one.

use std::path::{Path, PathBuf};

/// The record's file name inside the cache folder.
const FILE: &str = "last-start.json";
/// The most bytes read back (a record is a few hundred).
const MAX_BYTES: u64 = 64 * 1024;

/// How one start of the worker ended up.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StartRecord {
    /// The worker process.
    pub pid: u32,
    /// When it was written (ms since the Unix epoch).
    pub at_ms: u64,
    /// True when the canary passed and the worker lends.
    pub passed: bool,
    /// The verdict's words, or the error that stopped the worker.
    pub detail: String,
}

/// Where the record of the worker using `cache_dir` lives.
pub fn path(cache_dir: &Path) -> PathBuf {
    cache_dir.join(FILE)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Records this process's start as `passed` with `detail`. Best effort:
/// a record that cannot be written is logged, and the worker runs on.
pub fn write(cache_dir: &Path, passed: bool, detail: &str) {
    let record = StartRecord {
        pid: std::process::id(),
        at_ms: now_ms(),
        passed,
        detail: detail.to_owned(),
    };
    let written = serde_json::to_vec(&record)
        .map_err(std::io::Error::other)
        .and_then(|bytes| {
            std::fs::create_dir_all(cache_dir)?;
            let part = cache_dir.join(format!("{FILE}.{}", record.pid));
            std::fs::write(&part, bytes)?;
            std::fs::rename(&part, path(cache_dir))
        });
    if let Err(e) = written {
        tracing::warn!(file = %path(cache_dir).display(), error = %e,
            "the start record could not be written; `minions-worker install` will not see this start");
    }
}

/// The last start recorded for `cache_dir`, if there is a readable one.
pub fn read(cache_dir: &Path) -> Option<StartRecord> {
    let file = std::fs::File::open(path(cache_dir)).ok()?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_BYTES), &mut bytes).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// True when this process has recorded its start already.
pub fn recorded_by_me(cache_dir: &Path) -> bool {
    read(cache_dir).is_some_and(|r| r.pid == std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_names_its_process() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        assert_eq!(read(dir.path()), None);
        assert!(!recorded_by_me(dir.path()));
        write(&dir.path().join("new"), false, "NATS refused");
        let r = read(&dir.path().join("new")).ok_or("no record")?;
        assert!(!r.passed && r.detail == "NATS refused" && r.pid == std::process::id());
        assert!(recorded_by_me(&dir.path().join("new")));
        // Garbage is no record.
        std::fs::write(path(dir.path()), b"{not json")?;
        assert_eq!(read(dir.path()), None);
        Ok(())
    }
}
