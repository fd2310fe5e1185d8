//! `minions-watchdog`: parse flags, set up logging, run until Ctrl-C or SIGTERM.

use clap::Parser;
use minions_watchdog::cli::WatchdogArgs;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    minions_endpoints::exit::report(run().await, minions_endpoints::exit::debug_from_env())
}

async fn run() -> anyhow::Result<()> {
    minions_endpoints::logging::init();
    let mut args = WatchdogArgs::parse();
    minions_endpoints::config_file::apply(&mut args.nats, &mut args.store, &mut args.security)?;
    if args.ledger.is_none() {
        args.ledger =
            minions_endpoints::config_file::usage_defaults(args.security.config.as_deref())?.ledger;
    }
    let (verify, verify_key) =
        minions_endpoints::config_file::trust_defaults(args.security.config.as_deref())?;
    if args.verify.is_none() {
        args.verify = verify;
    }
    if args.verify_key.is_none() {
        args.verify_key = verify_key;
    }
    let config = args.into_config()?;
    let shutdown = CancellationToken::new();
    tokio::spawn(minions_endpoints::signals::cancel_on_signal(
        shutdown.clone(),
    ));
    minions_watchdog::run(config, shutdown).await?;
    Ok(())
}
