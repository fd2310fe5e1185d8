//! Log set-up for the binaries: `tracing` to stderr, filtered by `RUST_LOG`
//! (default `info`), colours only on a terminal.

use std::io::IsTerminal;

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
