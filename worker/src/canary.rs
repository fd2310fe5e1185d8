//! The canary gate: before a worker pulls any work it runs the canary shard
//! ([`minions_schemas::canary`]) on its own device and kernel path, and
//! sends its answers to the watchdogs on `minions.canary.<machine>`; one of
//! them judges them against the known answer. Every start runs it, so a new
//! build, device or kernel path is always checked before real shards.
//!
//! A worker that fails stops with an error and pulls nothing (the watchdog
//! has quarantined its machine). When no watchdog answers (none running,
//! or an identity made before canaries existed that may not send one), the
//! worker judges its answers itself against the known answer it was built
//! with, and says so.

use std::path::Path;
use std::time::Duration;

use minions_schemas::messages::{CanaryAnswer, CanaryReport, CanaryVerdict};
use minions_schemas::{SCHEMA_VERSION, canary, decode, encode, limits, subjects};

use crate::context::Ctx;
use crate::worker_error::WorkerError;

/// How long one request for a verdict waits.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests for a verdict before the worker judges itself.
const ASKS: u32 = 3;

/// Runs the canary and returns once this worker may pull work (with the
/// verdict in words: who judged, and what), or the reason it may not.
pub(crate) async fn gate(ctx: &Ctx, cache_dir: &Path) -> Result<String, WorkerError> {
    let worker = ctx.identity.worker_id();
    let started = std::time::Instant::now();
    let dir = cache_dir.join(format!("canary-{worker}"));
    let (answers, speech) = run_on(ctx.cache.device().clone(), ctx.cache.engine_path(), &dir)
        .await
        .map_err(|detail| WorkerError::Canary {
            by: "this worker".into(),
            detail,
            machine: subjects::machine(&worker).to_owned(),
        })?;
    let ran_ms = started.elapsed().as_millis() as u64;
    let report = CanaryReport {
        v: SCHEMA_VERSION,
        worker: worker.to_string(),
        made_by: ctx.identity.made_by.clone(),
        answers,
        speech: Some(speech),
    };
    let verdict = match ask(ctx, &report).await {
        Some(v) => v,
        None => {
            let judged = canary::judge(&report.answers, report.speech.as_ref());
            tracing::warn!(
                "no watchdog judged the canary: judged by this worker against the known answer it was built with"
            );
            CanaryVerdict {
                v: SCHEMA_VERSION,
                passed: judged.is_ok(),
                detail: judged.unwrap_or_else(|e| e),
                by: "this worker".into(),
            }
        }
    };
    if verdict.passed {
        tracing::info!(by = %verdict.by, detail = %verdict.detail, ran_ms,
            build = %ctx.identity.made_by.build, device = %ctx.identity.made_by.device, kernel = %ctx.identity.made_by.kernel,
            "canary passed");
        Ok(format!("judged by {}: {}", verdict.by, verdict.detail))
    } else {
        tracing::error!(by = %verdict.by, detail = %verdict.detail,
            build = %ctx.identity.made_by.build, device = %ctx.identity.made_by.device, kernel = %ctx.identity.made_by.kernel,
            "canary FAILED: this machine's kernels give wrong answers; pulling nothing");
        Err(WorkerError::Canary {
            by: verdict.by,
            detail: verdict.detail,
            machine: subjects::machine(&worker).to_owned(),
        })
    }
}

/// Builds the canary model in `dir`, runs it on `device` (the code `path`
/// names) and removes the folder, then runs the speech canary; returns the
/// embedding answers and the speech answer, or what went wrong, in words.
pub(crate) async fn run_on(
    device: candle_core::Device,
    path: minions_engine::EnginePath,
    dir: &Path,
) -> Result<(Vec<CanaryAnswer>, CanaryAnswer), String> {
    let d = dir.to_owned();
    let ran = tokio::task::spawn_blocking(move || {
        let r = minions_engine::canary::write_model(&d)
            .and_then(|()| minions_engine::canary::run(&d, &device, path));
        let _ = std::fs::remove_dir_all(&d);
        let speech = minions_engine::speech::canary::run(&device, path);
        r.and_then(|answers| Ok((answers, speech?)))
    })
    .await;
    match ran {
        Ok(Ok(answers)) => Ok(answers),
        Ok(Err(e)) => Err(format!("the canary shard could not run: {e}")),
        Err(e) => Err(format!("the canary shard panicked: {e}")),
    }
}

/// Asks the watchdogs for a verdict; `None` when none gave one.
async fn ask(ctx: &Ctx, report: &CanaryReport) -> Option<CanaryVerdict> {
    let payload = match encode("canary report", report) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "the canary report does not encode");
            return None;
        }
    };
    let subject = subjects::canary(&ctx.identity.worker_id());
    for attempt in 1..=ASKS {
        let asked = tokio::time::timeout(
            ASK_TIMEOUT,
            ctx.client.request(subject.clone(), payload.clone().into()),
        )
        .await;
        match asked {
            Ok(Ok(reply)) => {
                match decode::<CanaryVerdict>(
                    "canary verdict",
                    &reply.payload,
                    limits::MAX_CANARY_BYTES,
                ) {
                    Ok(v) => return Some(v),
                    Err(e) => tracing::warn!(error = %e, "a canary verdict does not decode"),
                }
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                tracing::info!(subject = %subject, "no watchdog listens for canaries");
                return None;
            }
            Ok(Err(e)) => tracing::warn!(error = %e, attempt, "asking for a canary verdict failed"),
            Err(_) => tracing::warn!(
                attempt,
                timeout_s = ASK_TIMEOUT.as_secs(),
                "no canary verdict in time"
            ),
        }
    }
    None
}
