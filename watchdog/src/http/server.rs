//! Routes and serving. Every handler copies a snapshot of the view and
//! renders it; nothing here writes to NATS or the store.

use std::net::SocketAddr;
use std::sync::Arc;

use async_nats::jetstream;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use minions_schemas::JobId;
use tokio_util::sync::CancellationToken;

use super::{metrics, pages};
use crate::explain::{self, JobFacts};
use crate::queue;
use crate::view::View;

/// Why the web server could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The address could not be bound.
    #[error(
        "cannot listen on {addr}: {source} (pick another with --listen HOST:PORT, or --listen off)"
    )]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

#[derive(Clone)]
struct Http {
    view: Arc<View>,
    js: jetstream::Context,
    client: async_nats::Client,
}

fn fragment_only(uri: &Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "fragment=1"))
}

fn html(body: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

fn json<T: serde::Serialize>(v: &T) -> Response {
    match serde_json::to_string(v) {
        Ok(s) => ([(header::CONTENT_TYPE, "application/json")], s).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn fleet(State(h): State<Http>, uri: Uri) -> Response {
    let s = h.view.snapshot();
    let body = pages::fleet(&s);
    if fragment_only(&uri) {
        html(body)
    } else {
        html(pages::page(
            "Minions fleet",
            &s.watchdog,
            "/?fragment=1",
            &body,
        ))
    }
}

async fn fleet_json(State(h): State<Http>) -> Response {
    json(&h.view.snapshot())
}

/// A job's progress and reasons, or the response to send instead.
async fn job_view(
    h: &Http,
    job: &str,
) -> Result<(minions_schemas::progress::Progress, Vec<explain::Reason>), Response> {
    let Ok(id) = JobId::new(job) else {
        return Err((StatusCode::BAD_REQUEST, format!("{job:?} is not a job id")).into_response());
    };
    let now = minions_schemas::time::now_ms();
    let found = {
        let jobs = h.view.jobs();
        jobs.get(&id).map(|j| {
            (
                j.progress(now),
                JobFacts {
                    model_mb: j.model_mb,
                    last_retry: j.last_retry.clone(),
                    queued: None,
                    sharing: None,
                },
            )
        })
    };
    let Some((p, mut facts)) = found else {
        return Err((
            StatusCode::NOT_FOUND,
            format!("job {job} is not known to this watchdog (no events yet, or its spec is missing from the store)"),
        )
            .into_response());
    };
    if !p.state.is_final() {
        facts.queued = queue::queued_for(&h.js, &id).await;
    }
    let workers = h.view.workers(std::time::Instant::now());
    if !p.state.is_final()
        && let Some(schedule) = h.view.schedule()
    {
        let lenders: Vec<(u64, String)> = workers
            .iter()
            .filter(|w| w.alive())
            .map(|w| {
                let mb = if w.mem_budget_mb > 0 {
                    w.mem_budget_mb
                } else {
                    w.mem_total_mb
                };
                (mb, w.device.clone())
            })
            .collect();
        facts.sharing = crate::schedule::why_waiting(&schedule, &id, &lenders);
    }
    let reasons = explain::explain(&p, &facts, &workers, &h.view.queue());
    Ok((p, reasons))
}

async fn job_page(State(h): State<Http>, Path(job): Path<String>, uri: Uri) -> Response {
    match job_view(&h, &job).await {
        Ok((p, reasons)) => {
            let body = pages::job(&p, &reasons);
            if fragment_only(&uri) {
                html(body)
            } else {
                let url = format!("/jobs/{}?fragment=1", p.job);
                html(pages::page(
                    &format!("Minions job {}", p.job),
                    &h.view.name,
                    &url,
                    &body,
                ))
            }
        }
        Err(r) => r,
    }
}

async fn job_json(State(h): State<Http>, Path(job): Path<String>) -> Response {
    #[derive(serde::Serialize)]
    struct JobJson {
        progress: minions_schemas::progress::Progress,
        waiting_because: Vec<explain::Reason>,
    }
    match job_view(&h, &job).await {
        Ok((progress, waiting_because)) => json(&JobJson {
            progress,
            waiting_because,
        }),
        Err(r) => r,
    }
}

async fn prometheus(State(h): State<Http>) -> Response {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        metrics::render(&h.view.snapshot()),
    )
        .into_response()
}

async fn healthz(State(h): State<Http>) -> Response {
    match h.client.connection_state() {
        async_nats::connection::State::Connected => (StatusCode::OK, "ok\n").into_response(),
        other => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not connected to NATS: {other}\n"),
        )
            .into_response(),
    }
}

/// The routes over `view`.
fn router(view: Arc<View>, js: jetstream::Context, client: async_nats::Client) -> Router {
    Router::new()
        .route("/", get(fleet))
        .route("/jobs/{job}", get(job_page))
        .route("/api/fleet", get(fleet_json))
        .route("/api/jobs/{job}", get(job_json))
        .route("/metrics", get(prometheus))
        .route("/healthz", get(healthz))
        .with_state(Http { view, js, client })
}

/// Binds `addr` and serves until `stop`; returns the bound address and the
/// serving task.
pub async fn serve(
    addr: &str,
    view: Arc<View>,
    js: jetstream::Context,
    client: async_nats::Client,
    stop: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), HttpError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind {
            addr: addr.to_owned(),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| HttpError::Bind {
        addr: addr.to_owned(),
        source,
    })?;
    let app = router(view, js, client);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
        {
            tracing::error!(error = %e, "dashboard server stopped");
        }
    });
    Ok((local, task))
}
