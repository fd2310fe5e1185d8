//! `minions-worker`: parse flags, set up logging, run until Ctrl-C or SIGTERM.

use clap::Parser;
use minions_worker::cli::{WorkerArgs, WorkerCommand};
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
    match &args.command {
        Some(WorkerCommand::Install {
            unit_dir,
            no_start,
            system,
            run_as,
        }) => {
            use minions_worker::service::{self, Scope};
            let scope = if *system {
                Scope::System {
                    run_as: run_as.clone(),
                }
            } else {
                Scope::User
            };
            let dir = match unit_dir {
                Some(d) => d.clone(),
                None => service::default_dir(&scope)?,
            };
            let me = std::env::current_exe()?;
            let path = service::install(&dir, &me, &WorkerArgs::service_args(), *no_start, &scope)?;
            tracing::info!(file = %path.display(), started = !no_start, system = *system,
                logs = %service::logs_hint(&scope), "worker service installed");
            return Ok(());
        }
        Some(WorkerCommand::Uninstall {
            unit_dir,
            no_stop,
            system,
        }) => {
            use minions_worker::service::{self, Scope};
            let scope = if *system {
                Scope::System { run_as: None }
            } else {
                Scope::User
            };
            let dir = match unit_dir {
                Some(d) => d.clone(),
                None => service::default_dir(&scope)?,
            };
            match service::uninstall(&dir, *no_stop, &scope)? {
                Some(p) => tracing::info!(file = %p.display(), "worker service removed"),
                None => tracing::info!(dir = %dir.display(), "no worker service installed there"),
            }
            return Ok(());
        }
        _ => {}
    }
    let doctor = matches!(args.command, Some(WorkerCommand::Doctor));
    let config = args.into_config()?;
    if doctor {
        let report = minions_worker::doctor::report(&config).await;
        let mut stdout = std::io::stdout().lock();
        std::io::Write::write_all(&mut stdout, format!("{report}\n").as_bytes())?;
        return Ok(());
    }
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
