//! `minions`: parse flags, set up logging, run one subcommand. Results go to
//! stdout (a job id, a status, a hash); logs go to stderr.

use std::io::Write;

use clap::Parser;
use minions::cli::{AdminCommand, Cli, Command, ModelCommand, TeamCommand, WorkerCommand};
use minions::commands;
use minions_schemas::messages::ControlCommand;
use minions_schemas::progress::JobState;
use tokio_util::sync::CancellationToken;

fn out(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}")?;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let verbose = cli.verbose || minions_endpoints::exit::debug_from_env();
    minions_endpoints::logging::init_cli(verbose);
    minions_endpoints::exit::report(run(cli).await, verbose)
}

async fn run(mut cli: Cli) -> anyhow::Result<()> {
    let e = &mut cli.endpoints;
    minions_endpoints::config_file::apply(&mut e.nats, &mut e.store, &mut e.security)?;
    let ep = &cli.endpoints;
    match cli.command {
        Command::Submit(args) => out(commands::submit::run(ep, *args).await?.job.as_str()),
        Command::Status(args) => out(&commands::status::run(ep, &args).await?.1),
        Command::Jobs(args) => out(&commands::jobs::run(ep, &args).await?.1),
        Command::Audit(args) => out(&commands::audit::run(ep, &args).await?),
        Command::Watch(args) => {
            let shutdown = CancellationToken::new();
            tokio::spawn(minions_endpoints::signals::cancel_on_signal(
                shutdown.clone(),
            ));
            let w = commands::watch::run(ep, &args, shutdown).await?;
            let p = &w.progress;
            if !w.ended {
                anyhow::bail!("interrupted; job {} is still {}", p.job, p.state.as_str());
            }
            match p.state {
                JobState::Done => {
                    if !args.json {
                        out(&p.render())?;
                    }
                    Ok(())
                }
                _ => {
                    if !args.json {
                        out(&p.render())?;
                    }
                    anyhow::bail!(
                        "job {} ended {}: {} of {} shards done, {} failed",
                        p.job,
                        p.state.as_str(),
                        p.done,
                        p.shards,
                        p.failed
                    )
                }
            }
        }
        Command::Collect(args) => {
            let r = commands::collect::run(ep, &args).await?;
            if r.dim == 0 {
                out(&format!(
                    "{} results written to {}{}",
                    r.rows,
                    args.output.display(),
                    if r.errors > 0 {
                        format!(" ({} records could not run; see their \"error\")", r.errors)
                    } else {
                        String::new()
                    }
                ))
            } else {
                out(&format!(
                    "{} vectors of dimension {} written to {}",
                    r.rows,
                    r.dim,
                    args.output.display()
                ))
            }
        }
        Command::Model(ModelCommand::Push(args)) => {
            out(commands::model::push(ep, args).await?.hash.as_str())
        }
        Command::Model(ModelCommand::List(args)) => out(&commands::model::list(ep, &args).await?),
        Command::Retry(a) => out(&commands::job_control::retry(ep, &a.job).await?),
        Command::Cancel(a) => out(&commands::job_control::cancel(ep, &a.job).await?),
        Command::Reconcile(a) => out(&commands::job_control::reconcile(ep, &a.job).await?),
        Command::Worker(WorkerCommand::List { json }) => {
            out(&commands::worker::list(ep, json).await?)
        }
        Command::Worker(WorkerCommand::Drain { worker }) => {
            out(&commands::worker::control(ep, &worker, ControlCommand::Drain).await?)
        }
        Command::Worker(WorkerCommand::Evict { worker }) => {
            out(&commands::worker::control(ep, &worker, ControlCommand::Evict).await?)
        }
        Command::Worker(WorkerCommand::Resume { worker }) => {
            out(&commands::worker::control(ep, &worker, ControlCommand::Resume).await?)
        }
        Command::Worker(WorkerCommand::Release { machine }) => {
            out(&commands::worker::release(ep, &machine).await?)
        }
        Command::Team(TeamCommand::Set(args)) => out(&commands::team::set(ep, &args).await?),
        Command::Team(TeamCommand::List { json }) => out(&commands::team::list(ep, json).await?),
        Command::Admin(AdminCommand::Init(args)) => out(&commands::admin::init(ep, &args).await?),
        Command::Admin(AdminCommand::AddWorker(args)) => {
            out(&commands::add_worker::add_worker(&args)?.report)
        }
        Command::Admin(AdminCommand::AddViewer(args)) => {
            use minions_schemas::access::Role;
            let role = if args.metrics_only {
                Role::Metrics
            } else {
                Role::Viewer
            };
            out(&commands::add_access::add(
                &args.access_file,
                &args.name,
                role,
            )?)
        }
        Command::Admin(AdminCommand::AddOperator(args)) => out(&commands::add_access::add(
            &args.access_file,
            &args.name,
            minions_schemas::access::Role::Operator,
        )?),
        Command::Admin(AdminCommand::AddProducer(args)) => {
            out(&commands::add_producer::add_producer(&args)?.report)
        }
        Command::Usage(args) => out(&commands::usage::run(ep, &args).await?),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "minions", &mut std::io::stdout().lock());
            Ok(())
        }
        Command::Man => {
            let cmd = <Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(cmd).render(&mut std::io::stdout().lock())?;
            Ok(())
        }
        Command::Dev(args) => {
            let shutdown = CancellationToken::new();
            tokio::spawn(minions_endpoints::signals::cancel_on_signal(
                shutdown.clone(),
            ));
            commands::dev::run(ep, &args, shutdown).await
        }
    }
}
