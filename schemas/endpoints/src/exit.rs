//! How the binaries end: a clean one-line error on stderr and a failing exit
//! code, instead of a debug dump.

use std::process::ExitCode;

/// Whether `MINIONS_DEBUG` asks for the detail of errors and logs (set and
/// not `0`, `false`, `no` or `off`), as `-v` does.
pub fn debug_from_env() -> bool {
    std::env::var("MINIONS_DEBUG").is_ok_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no" | "off"
        )
    })
}

/// Reports `result` the way a person wants to read it: nothing on success;
/// on failure one line, `error: <message: its causes>`, whatever
/// `RUST_BACKTRACE` says. `verbose` (`-v`, `MINIONS_DEBUG=1`) adds the
/// causes one per line and the backtrace when one was captured
/// (`RUST_BACKTRACE=1`).
pub fn report(result: anyhow::Result<()>, verbose: bool) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::debug!(error = %format!("{e:#}"), "exiting with an error");
            let text = describe(&e, verbose);
            let mut stderr = std::io::stderr().lock();
            let _ = std::io::Write::write_fmt(&mut stderr, format_args!("{text}\n"));
            ExitCode::FAILURE
        }
    }
}

/// The text [`report`] prints for `e`.
pub fn describe(e: &anyhow::Error, verbose: bool) -> String {
    if !verbose {
        return format!("error: {e:#}");
    }
    let mut out = format!("error: {e}");
    let causes: Vec<String> = e.chain().skip(1).map(|c| c.to_string()).collect();
    if !causes.is_empty() {
        out.push_str("\ncaused by:");
        for (i, c) in causes.iter().enumerate() {
            out.push_str(&format!("\n  {i}: {c}"));
        }
    }
    let bt = e.backtrace();
    if bt.status() == std::backtrace::BacktraceStatus::Captured {
        out.push_str(&format!("\nbacktrace:\n{bt}"));
    } else {
        out.push_str("\n(no backtrace captured: set RUST_BACKTRACE=1 as well for one)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_alone_unless_verbose() {
        let e = anyhow::anyhow!("connection refused").context("connecting to NATS");
        assert_eq!(
            describe(&e, false),
            "error: connecting to NATS: connection refused"
        );
        let v = describe(&e, true);
        assert!(
            v.starts_with("error: connecting to NATS\ncaused by:\n  0: connection refused"),
            "{v}"
        );
    }
}
