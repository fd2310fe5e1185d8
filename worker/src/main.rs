//! `minions-worker`: parse flags, set up logging, run until Ctrl-C or SIGTERM.

use clap::Parser;
use minions_worker::cli::{WorkerArgs, WorkerCommand};
use minions_worker::install;
use minions_worker::service::Scope;
use tokio_util::sync::CancellationToken;

/// See `minions_worker::process_env` for why, and how long freed memory
/// is kept.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    minions_endpoints::exit::report(run().await, minions_endpoints::exit::debug_from_env())
}

async fn run() -> anyhow::Result<()> {
    minions_worker::process_env::fix_process_env();
    minions_endpoints::logging::init();
    let mut args = WorkerArgs::parse();
    minions_endpoints::config_file::apply(&mut args.nats, &mut args.store, &mut args.security)?;
    match args.command.take() {
        Some(WorkerCommand::Install {
            unit_dir,
            no_start,
            system,
            run_as,
            wait,
        }) => {
            let request = install::InstallRequest {
                unit_dir,
                no_start,
                scope: if system {
                    Scope::System { run_as }
                } else {
                    Scope::User
                },
                wait: std::time::Duration::from_secs(wait),
                args: WorkerArgs::service_args(),
                cache_dir: args.cache_dir.clone(),
            };
            return say(&install::install(&request).await?);
        }
        Some(WorkerCommand::Uninstall {
            unit_dir,
            no_stop,
            system,
        }) => {
            let scope = if system {
                Scope::System { run_as: None }
            } else {
                Scope::User
            };
            return say(&install::uninstall(unit_dir.as_deref(), no_stop, &scope)?);
        }
        Some(WorkerCommand::Doctor) => {
            let config = args.into_config()?;
            return say(&format!(
                "{}\n",
                minions_worker::doctor::report(&config).await
            ));
        }
        None => {}
    }
    let config = args.into_config()?;
    let shutdown = CancellationToken::new();
    tokio::spawn(minions_endpoints::signals::cancel_on_signal(
        shutdown.clone(),
    ));
    let summary = minions_worker::run(config, shutdown).await?;
    if !summary.handed_back.is_empty() {
        tracing::warn!(shards = ?summary.handed_back, "handed back unfinished shards");
    }
    Ok(())
}

/// Writes a command's answer to stdout.
fn say(text: &str) -> anyhow::Result<()> {
    std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes())?;
    Ok(())
}
