//! How the binaries end: a clean one-line error on stderr and a failing exit
//! code, instead of a debug dump.

use std::process::ExitCode;

/// Reports `result` the way a person wants to read it: nothing on success;
/// `error: <cause chain>` on failure (`RUST_BACKTRACE=1` adds a backtrace).
pub fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::debug!(error = ?e, "exiting with an error");
            let mut stderr = std::io::stderr().lock();
            let _ = std::io::Write::write_fmt(&mut stderr, format_args!("error: {e:#}\n"));
            if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
                let _ = std::io::Write::write_fmt(&mut stderr, format_args!("{}\n", e.backtrace()));
            }
            ExitCode::FAILURE
        }
    }
}
