//! Why an energy meter cannot be read.

use std::path::PathBuf;

/// Why a meter could not be opened or read. The worker never fails on one:
/// it falls back to the next meter, and in the end to the estimate.
#[derive(Debug, thiserror::Error)]
pub enum EnergyError {
    /// The powercap folder holds no RAPL package domain (not Linux, no
    /// RAPL driver, or a virtual machine that does not pass it through).
    #[error("no RAPL package domains under {}", root.display())]
    RaplAbsent {
        /// The powercap folder looked at.
        root: PathBuf,
    },
    /// A RAPL counter exists but this user may not read it: since Linux
    /// 5.10 `energy_uj` is readable by root only.
    #[error(
        "{} is not readable by this user (since Linux 5.10 RAPL energy counters are root-only): run the worker as root, or let it read them with a udev rule or `chmod a+r`",
        path.display()
    )]
    RaplPermission {
        /// The counter that could not be read.
        path: PathBuf,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A file or a tool's output is not what the meter expects.
    #[error("{what}: cannot read {text:?}")]
    Parse {
        /// What was being read.
        what: &'static str,
        /// The offending text, cut to 120 characters.
        text: String,
    },
    /// A tool could not be run, timed out, printed too much, or failed.
    #[error("{tool}: {reason}")]
    Tool {
        /// The program.
        tool: &'static str,
        /// What went wrong.
        reason: String,
    },
}

/// The most characters of foreign text an error quotes (documented as
/// 120 on [`EnergyError::parse`]).
pub(crate) const MAX_QUOTED: usize = 120;

impl EnergyError {
    /// A [`EnergyError::Parse`] quoting at most 120 characters of `text`.
    pub fn parse(what: &'static str, text: &str) -> Self {
        Self::Parse {
            what,
            text: text.chars().take(MAX_QUOTED).collect(),
        }
    }

    /// A [`EnergyError::Tool`] error.
    pub fn tool(tool: &'static str, reason: impl Into<String>) -> Self {
        Self::Tool {
            tool,
            reason: reason.into(),
        }
    }
}
