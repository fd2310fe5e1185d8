//! Log set-up for the binaries: `tracing` to stderr, filtered by `RUST_LOG`
//! (default `info`), colours only on a terminal.

use std::io::IsTerminal;

/// Our crates' log targets: what the command line shows by default.
const OURS: &[&str] = &[
    "minions",
    "minions_endpoints",
    "minions_schemas",
    "minions_worker",
    "minions_watchdog",
    "minions_engine",
];

/// Installs the global subscriber for a service (worker, watchdog): every
/// crate's logs at `info` unless `RUST_LOG` says otherwise. Call once,
/// first thing in `main`.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    install(filter);
}

/// Installs the global subscriber for the `minions` command line: only our
/// own crates' logs at `info` (a library's own lines, such as a NATS
/// client's connection events, are not shown: the command's error says
/// what failed); `verbose` shows every crate's at `debug` for ours and
/// `info` for the rest; `RUST_LOG` overrides both.
pub fn init_cli(verbose: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(cli_directives(verbose)));
    install(filter);
}

/// The filter directives of [`init_cli`] when `RUST_LOG` is not set.
pub fn cli_directives(verbose: bool) -> String {
    let level = if verbose { "debug" } else { "info" };
    let ours = OURS.iter().map(|t| format!("{t}={level}"));
    if verbose {
        std::iter::once("info".to_owned())
            .chain(ours)
            .collect::<Vec<_>>()
            .join(",")
    } else {
        // Unnamed targets (libraries) default to off.
        ours.collect::<Vec<_>>().join(",")
    }
}

fn install(filter: tracing_subscriber::EnvFilter) {
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_shows_our_logs_alone_unless_verbose() {
        let quiet = cli_directives(false);
        assert!(quiet.contains("minions=info") && !quiet.contains("async_nats"));
        assert!(!quiet.split(',').any(|d| d == "info"));
        assert!(cli_directives(true).starts_with("info,minions=debug"));
    }
}
