//! `minions-worker`: parse flags, set up logging, run until Ctrl-C or SIGTERM.

use clap::Parser;
use minions_worker::cli::WorkerArgs;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    minions_schemas::endpoints::exit::report(run().await)
}

async fn run() -> anyhow::Result<()> {
    minions_schemas::endpoints::logging::init();
    let config = WorkerArgs::parse().into_config()?;
    let shutdown = CancellationToken::new();
    tokio::spawn(minions_schemas::endpoints::signals::cancel_on_signal(
        shutdown.clone(),
    ));
    let summary = minions_worker::run(config, shutdown).await?;
    if !summary.handed_back.is_empty() {
        tracing::warn!(shards = ?summary.handed_back, "handed back unfinished shards");
    }
    Ok(())
}
