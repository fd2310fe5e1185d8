//! `minions watch`: a job's progress live until it ends: a progress bar with
//! rate and ETA on a terminal, a line per change otherwise, or JSON lines
//! with `--json`. Folds the job's events as they arrive (one ordered
//! consumer), so a large job costs the same per second as a small one.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use minions_endpoints::follow::{Follower, Read};
use minions_schemas::messages::ShardEvent;
use minions_schemas::progress::{JobFold, JobState, Progress, human_secs};
use minions_schemas::{JobId, decode, keys, limits, subjects};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use tokio_util::sync::CancellationToken;

use crate::cli::{Endpoints, WatchArgs};
use crate::store_io::job_spec;

/// How the job ended, or that the watch was interrupted.
#[derive(Debug)]
pub struct Watched {
    /// The last progress seen.
    pub progress: Progress,
    /// False when interrupted before the job ended.
    pub ended: bool,
}

fn summary(p: &Progress) -> String {
    let eta = match p.eta_secs {
        Some(e) if !p.state.is_final() => format!(", ETA {}", human_secs(e)),
        _ => String::new(),
    };
    let tokens = if p.tokens > 0 {
        format!(" · {} tokens, {:.1} tokens/s", p.tokens, p.token_rate)
    } else {
        String::new()
    };
    let audio = if p.audio_secs > 0.0 {
        format!(
            " · {} of audio, {:.1}× real time",
            human_secs(p.audio_secs),
            p.audio_rate
        )
    } else {
        String::new()
    };
    format!(
        "{:.1} records/s{eta}{tokens}{audio} · {} running, {} pending, {} failed",
        p.rate, p.running, p.pending, p.failed
    )
}

enum Display {
    Bar(ProgressBar),
    Lines {
        last: Option<(u32, u32, u32, u32)>,
        at: Instant,
    },
    Json,
}

impl Display {
    fn new(json: bool, shards: u32) -> Self {
        if json {
            return Self::Json;
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(
                Some(u64::from(shards)),
                ProgressDrawTarget::stderr_with_hz(4),
            );
            let style = ProgressStyle::with_template(
                "{prefix} [{bar:40.green/white}] {pos}/{len} shards {percent:>3}% · {msg}",
            )
            .map(|s| s.progress_chars("=> "));
            if let Ok(style) = style {
                bar.set_style(style);
            }
            Self::Bar(bar)
        } else {
            Self::Lines {
                last: None,
                at: Instant::now(),
            }
        }
    }

    fn show(&mut self, p: &Progress) -> anyhow::Result<()> {
        match self {
            Self::Bar(bar) => {
                bar.set_prefix(p.job.clone());
                bar.set_position(u64::from(p.done));
                bar.set_message(summary(p));
            }
            Self::Lines { last, at } => {
                let now = (p.done, p.running, p.failed, p.pending);
                let due = at.elapsed() >= Duration::from_secs(2) || p.state.is_final();
                if *last != Some(now) && due {
                    let mut out = std::io::stdout().lock();
                    writeln!(
                        out,
                        "job {}: {}/{} shards done ({:.1}%) · {}",
                        p.job,
                        p.done,
                        p.shards,
                        100.0 * p.fraction_done(),
                        summary(p)
                    )?;
                    *last = Some(now);
                    *at = Instant::now();
                }
            }
            Self::Json => {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", serde_json::to_string(p)?)?;
            }
        }
        Ok(())
    }

    fn finish(&self) {
        if let Self::Bar(bar) = self {
            bar.finish();
        }
    }
}

/// Watches `args.job` until it ends or `stop` fires.
pub async fn run(
    endpoints: &Endpoints,
    args: &WatchArgs,
    stop: CancellationToken,
) -> anyhow::Result<Watched> {
    let job = JobId::new(&args.job).context("job id")?;
    let store = minions_endpoints::store::open(&endpoints.store_url())?;
    let (_, js) = endpoints.connect("minions watch").await?;
    let spec = job_spec(store.as_ref(), &job).await?;
    let mut fold = JobFold::new(spec.clone());
    // A follower, not a bare ordered consumer: after a server restart the
    // latter was seen to fall silent while events went on.
    let mut events = Follower::start_with(
        &js,
        &subjects::job_events(&job),
        0,
        minions_endpoints::follow::STALL_AFTER,
    )
    .await
    .context("following the job's events")?;
    let marker = StorePath::from(keys::job_cancelled(&job));
    let mut display = Display::new(args.json, spec.shards);
    let mut tick = tokio::time::interval(Duration::from_millis(args.interval_ms.max(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_marker_check = Instant::now() - Duration::from_secs(60);
    let mut cancelled = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => {
                display.finish();
                let progress = fold.progress(minions_schemas::time::now_ms());
                return Ok(Watched { progress, ended: false });
            }
            m = events.next() => match m {
                Some(Ok(Read { message: m, .. })) => match decode::<ShardEvent>("shard event", &m.payload, limits::MAX_EVENT_BYTES) {
                    Ok(e) if e.is_on(&m.subject) => {
                                fold.apply(&e);
                            }
                    Ok(e) => tracing::warn!(subject = %m.subject, worker = %e.worker, "ignoring an event on a subject its sender does not use"),
                    Err(e) => tracing::warn!(subject = %m.subject, error = %e, "ignoring an event that does not decode"),
                },
                Some(Err(e)) => tracing::warn!(error = %e, "reading the job's events; retrying"),
                None => anyhow::bail!("the events stream ended"),
            },
            _ = tick.tick() => {
                if last_marker_check.elapsed() >= Duration::from_secs(2) {
                    cancelled = store.head(&marker).await.is_ok();
                    last_marker_check = Instant::now();
                }
                let mut p = fold.progress(minions_schemas::time::now_ms());
                if cancelled && p.state != JobState::Done {
                    p.state = JobState::Cancelled;
                }
                display.show(&p)?;
                if p.state.is_final() {
                    display.finish();
                    return Ok(Watched { progress: p, ended: true });
                }
            }
        }
    }
}
