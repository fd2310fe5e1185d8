//! `minions-worker`: parse flags, set up logging, run until Ctrl-C or SIGTERM.

use clap::Parser;
use minions_worker::cli::{WorkerArgs, WorkerCommand};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    minions_schemas::endpoints::exit::report(run().await)
}

async fn run() -> anyhow::Result<()> {
    minions_schemas::endpoints::logging::init();
    let args = WorkerArgs::parse();
    let doctor = matches!(args.command, Some(WorkerCommand::Doctor));
    let config = args.into_config()?;
    if doctor {
        let report = minions_worker::doctor::report(&config).await;
        let mut stdout = std::io::stdout().lock();
        std::io::Write::write_all(&mut stdout, format!("{report}\n").as_bytes())?;
        return Ok(());
    }
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
