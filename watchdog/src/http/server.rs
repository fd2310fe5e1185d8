//! Routes and serving. Every handler copies a snapshot of the view and
//! renders it; a finished job the view no longer holds is read from its
//! manifest and spec in the store. Every route but `/healthz` and
//! `/signin` is behind [`super::access::guard`]. Only the actions under
//! `/act/` (operators only) write: each puts itself on record, then asks a
//! worker, writes a quarantine record, or cancels or retries a job. `/usage` reads
//! the usage ledger (PostgreSQL) on request, through [`usage::LedgerReader`]:
//! no other route waits on the database.

use std::net::SocketAddr;
use std::sync::Arc;

use async_nats::jetstream;
use axum::Extension;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use minions_endpoints::{control, job_control};
use minions_schemas::access::{Role, Who};
use minions_schemas::messages::{ActionKind, ControlCommand};
use minions_schemas::{JobId, WorkerId};
use object_store::{ObjectStore, ObjectStoreExt};
use tokio_util::sync::CancellationToken;

use super::access::HttpAccess;
use super::pages::Shell;
use super::usage::{self, LedgerReader};
use super::{metrics, pages};
use crate::explain::{self, JobFacts};
use crate::ledger::LedgerStatus;
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
    /// The certificate or key does not make a TLS server.
    #[error(transparent)]
    Tls(#[from] super::tls::TlsSetupError),
}

#[derive(Clone)]
struct Http {
    view: Arc<View>,
    js: jetstream::Context,
    client: async_nats::Client,
    store: Arc<dyn ObjectStore>,
    work: minions_schemas::streams::WorkSettings,
    /// The ledger writer's status, when the watchdog keeps a ledger.
    ledger_status: Option<Arc<LedgerStatus>>,
    /// The ledger's reader, when the watchdog keeps a ledger.
    ledger: Option<Arc<LedgerReader>>,
}

/// Seconds between refreshes of the usage page (each reads the ledger).
const USAGE_EVERY_SECS: u32 = 30;

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

/// Whether the request's user may act (operators see the action buttons).
fn can_act(who: Option<&Extension<Who>>) -> bool {
    who.is_some_and(|w| w.role >= Role::Operator)
}

async fn fleet(State(h): State<Http>, who: Option<Extension<Who>>, uri: Uri) -> Response {
    let s = h.view.snapshot();
    let body = pages::fleet(&s, can_act(who.as_ref()));
    if fragment_only(&uri) {
        html(body)
    } else {
        html(pages::page(
            &Shell::live(
                "Minions fleet",
                &s.watchdog,
                "/?fragment=1",
                h.ledger.is_some(),
            ),
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
    let found = match found {
        Some(found) => Some(found),
        None => finished_from_store(h.store.as_ref(), &id).await.map(|p| {
            let facts = JobFacts {
                model_mb: None,
                last_retry: None,
                queued: None,
                sharing: None,
            };
            (p, facts)
        }),
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
        let split = schedule
            .jobs
            .iter()
            .find(|j| j.job == id)
            .map_or(0, |j| j.needs.stages);
        // A job on a group (asked for, or formed because no one worker
        // holds its model) waits as its group does.
        let grouped = split > 1 || h.view.on_group(&id);
        facts.sharing = match h.view.group_wait(&id) {
            Some(why) => Some(why),
            None if grouped => None,
            None => crate::schedule::why_waiting(&schedule, &id, &lenders),
        };
        if grouped {
            facts.model_mb = None;
        }
    }
    let reasons = explain::explain(&p, &facts, &workers, &h.view.queue());
    Ok((p, reasons))
}

async fn job_page(
    State(h): State<Http>,
    who: Option<Extension<Who>>,
    Path(job): Path<String>,
    uri: Uri,
) -> Response {
    match job_view(&h, &job).await {
        Ok((p, reasons)) => {
            let body = pages::job(&p, &reasons, can_act(who.as_ref()));
            if fragment_only(&uri) {
                html(body)
            } else {
                let url = format!("/jobs/{}?fragment=1", p.job);
                let title = format!("Minions job {}", p.job);
                let json_url = format!("/api/jobs/{}", p.job);
                html(pages::page(
                    &Shell {
                        json_url: &json_url,
                        ..Shell::live(&title, &h.view.name, &url, h.ledger.is_some())
                    },
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

async fn usage_page(State(h): State<Http>, uri: Uri) -> Response {
    let Some(reader) = &h.ledger else {
        let body = pages::no_ledger();
        let page = if fragment_only(&uri) {
            body
        } else {
            pages::page(
                &Shell {
                    fragment_url: None,
                    json_url: "/api/usage",
                    ..Shell::live("Minions usage", &h.view.name, "", false)
                },
                &body,
            )
        };
        return (StatusCode::NOT_FOUND, html(page)).into_response();
    };
    let days = match usage::parse_days(uri.query()) {
        Ok(d) => d,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let body = pages::usage(&reader.report(days).await);
    if fragment_only(&uri) {
        return html(body);
    }
    let fragment_url = format!("/usage?days={days}&fragment=1");
    let json_url = format!("/api/usage?days={days}");
    html(pages::page(
        &Shell {
            every_secs: USAGE_EVERY_SECS,
            json_url: &json_url,
            ..Shell::live("Minions usage", &h.view.name, &fragment_url, true)
        },
        &body,
    ))
}

async fn usage_json(State(h): State<Http>, uri: Uri) -> Response {
    #[derive(serde::Serialize)]
    struct Refused {
        error: String,
    }
    let refuse = |code: StatusCode, error: String| (code, json(&Refused { error })).into_response();
    let Some(reader) = &h.ledger else {
        return refuse(StatusCode::NOT_FOUND, pages::NO_LEDGER.to_owned());
    };
    let days = match usage::parse_days(uri.query()) {
        Ok(d) => d,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let report = reader.report(days).await;
    if report.error.is_some() {
        (StatusCode::SERVICE_UNAVAILABLE, json(&report)).into_response()
    } else {
        json(&report)
    }
}

async fn prometheus(State(h): State<Http>) -> Response {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        metrics::render(&h.view.snapshot(), h.ledger_status.as_deref()),
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

/// The progress of a finished job that the view no longer holds (only the
/// newest finished jobs are kept), from its manifest and spec in the store.
async fn finished_from_store(
    store: &dyn ObjectStore,
    job: &JobId,
) -> Option<minions_schemas::progress::Progress> {
    use minions_schemas::messages::JobSpec;
    use minions_schemas::{decode, keys, limits};
    async fn read(store: &dyn ObjectStore, key: String, limit: usize) -> Option<bytes::Bytes> {
        let got = store.get(&object_store::path::Path::from(key)).await.ok()?;
        if got.meta.size > limit as u64 {
            return None;
        }
        got.bytes().await.ok()
    }
    let (_, m) = minions_endpoints::manifest::latest(store, job)
        .await
        .ok()
        .flatten()?;
    let spec = read(store, keys::job_spec(job), limits::MAX_SPEC_BYTES).await?;
    let spec: JobSpec = decode("job spec", &spec, limits::MAX_SPEC_BYTES).ok()?;
    let closed = minions_schemas::progress::ClosedFold::from_record(spec, &m);
    Some(closed.progress().clone())
}

/// What the routes read: the view, NATS and the store.
pub struct Backends {
    /// What the watchdog knows.
    pub view: Arc<View>,
    /// JetStream (queue figures).
    pub js: jetstream::Context,
    /// The NATS connection (`/healthz`).
    pub client: async_nats::Client,
    /// The store (manifests of finished jobs the view no longer holds).
    pub store: Arc<dyn ObjectStore>,
    /// The work stream's settings (a retried job's consumer).
    pub work: minions_schemas::streams::WorkSettings,
}

/// The page that says how an action went, with the way back.
fn acted(h: &Http, outcome: Result<String, String>) -> Response {
    let (code, title, text, ok) = match outcome {
        Ok(text) => (StatusCode::OK, "Done", text, true),
        Err(text) => (StatusCode::BAD_GATEWAY, "Not done", text, false),
    };
    let shell = Shell {
        title,
        watchdog: &h.view.name,
        fragment_url: None,
        every_secs: 0,
        json_url: "/api/fleet",
        ledger: h.ledger.is_some(),
    };
    (code, html(pages::page(&shell, &pages::acted(&text, ok)))).into_response()
}

/// `POST /act/worker/{id}/{drain|evict|resume}`: asks the worker, on record
/// under the signed-in operator's name.
async fn act_worker(
    State(h): State<Http>,
    Extension(who): Extension<Who>,
    Path((worker, command)): Path<(String, String)>,
) -> Response {
    let command = match command.as_str() {
        "drain" => ControlCommand::Drain,
        "evict" => ControlCommand::Evict,
        "resume" => ControlCommand::Resume,
        other => {
            return (
                StatusCode::NOT_FOUND,
                format!("{other:?} is not an action on a worker (drain, evict, resume)\n"),
            )
                .into_response();
        }
    };
    let Ok(id) = WorkerId::new(&worker) else {
        return (
            StatusCode::BAD_REQUEST,
            format!("{worker:?} is not a worker id\n"),
        )
            .into_response();
    };
    let actor = control::Actor {
        by: &who.name,
        via: "dashboard",
    };
    let outcome = control::ask(&h.client, &h.js, actor, &id, command)
        .await
        .map(|r| {
            format!(
                "worker {}: {} ({} shards handed back), asked by {}",
                r.worker, r.status, r.handed_back, who.name
            )
        })
        .map_err(|e| e.to_string());
    tracing::info!(by = %who.name, worker = %id, command = ?command, ok = outcome.is_ok(), "dashboard action");
    acted(&h, outcome)
}

/// `POST /act/job/{job}/{cancel|retry}`: cancels the job or queues its
/// failed shards again, on record under the signed-in operator's name.
async fn act_job(
    State(h): State<Http>,
    Extension(who): Extension<Who>,
    Path((job, action)): Path<(String, String)>,
) -> Response {
    let action = match action.as_str() {
        "cancel" => ActionKind::Cancel,
        "retry" => ActionKind::Retry,
        other => {
            return (
                StatusCode::NOT_FOUND,
                format!("{other:?} is not an action on a job (cancel, retry)\n"),
            )
                .into_response();
        }
    };
    let Ok(id) = JobId::new(&job) else {
        return (
            StatusCode::BAD_REQUEST,
            format!("{job:?} is not a job id\n"),
        )
            .into_response();
    };
    let outcome = act_on_job(&h, &who.name, &id, action).await;
    tracing::info!(by = %who.name, job = %id, action = action.as_str(), ok = outcome.is_ok(), "dashboard action");
    acted(&h, outcome)
}

/// Puts `action` on `job` on record as `by`'s, then does it.
async fn act_on_job(h: &Http, by: &str, job: &JobId, action: ActionKind) -> Result<String, String> {
    let failed = crate::job_requests::failed_shards(&h.view, job);
    if action == ActionKind::Retry && failed.is_empty() {
        return Ok(format!("job {job}: no failed shards to retry"));
    }
    let detail = if action == ActionKind::Retry {
        format!("{} failed shards", failed.len())
    } else {
        String::new()
    };
    minions_endpoints::actions::record(&h.js, by, "dashboard", action, job.as_str(), &detail)
        .await
        .map_err(|e| e.to_string())?;
    if action == ActionKind::Cancel {
        let purged = job_control::cancel(&h.js, &h.client, h.store.as_ref(), job)
            .await
            .map_err(|e| e.to_string())?;
        return Ok(format!(
            "job {job}: cancelled by {by}; {purged} pending shards removed, running shards stopped"
        ));
    }
    let spec = crate::orphans::read_spec(h.store.as_ref(), job)
        .await
        .ok_or_else(|| format!("job {job}: its spec cannot be read from the store"))?;
    let n = crate::job_requests::requeue(&h.js, &h.work, &spec, &failed).await?;
    Ok(format!("job {job}: {n} failed shards resubmitted by {by}"))
}

/// `POST /act/machine/{machine}/release`: lifts a quarantine, on record
/// under the signed-in operator's name.
async fn act_release(
    State(h): State<Http>,
    Extension(who): Extension<Who>,
    Path(machine): Path<String>,
) -> Response {
    let actor = control::Actor {
        by: &who.name,
        via: "dashboard",
    };
    let outcome = control::release(&h.js, actor, &machine)
        .await
        .map(|r| {
            format!(
                "machine {} released by {} ({} strikes so far); its workers pull again within a few seconds",
                r.machine, who.name, r.strikes
            )
        })
        .map_err(|e| e.to_string());
    tracing::info!(by = %who.name, machine, ok = outcome.is_ok(), "dashboard action");
    acted(&h, outcome)
}

/// The sign-in form: a known token sets the sign-in cookie and goes to
/// the dashboard; anything else shows the form again, saying why.
async fn sign_in_page() -> Response {
    html(pages::sign_in(None))
}

async fn sign_in(State(access): State<Arc<HttpAccess>>, body: axum::body::Bytes) -> Response {
    let token = super::access::posted_token(&body);
    let list = access.current();
    match token.filter(|t| list.by_token(t).is_some()) {
        Some(t) => (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, "/".to_owned()),
                (
                    header::SET_COOKIE,
                    format!(
                        "{}={t}; HttpOnly; SameSite=Strict; Path=/{}",
                        minions_schemas::access::COOKIE,
                        if access.tls.is_some() { "; Secure" } else { "" }
                    ),
                ),
            ],
        )
            .into_response(),
        None => (
            StatusCode::UNAUTHORIZED,
            axum::response::Html(pages::sign_in(Some(
                "That token is not known here. Tokens are made by `minions admin add-viewer` and read from the watchdog's --http-access file.",
            ))),
        )
            .into_response(),
    }
}

/// The routes over `b` (and the ledger, when there is one), behind
/// `access`.
fn router(
    b: Backends,
    ledger_status: Arc<LedgerStatus>,
    ledger_url: Option<String>,
    access: Arc<HttpAccess>,
) -> Router {
    let ledger = ledger_url.map(|url| Arc::new(LedgerReader::new(url, ledger_status.clone())));
    let ledger_status = ledger.is_some().then_some(ledger_status);
    let sign_in_routes = Router::new()
        .route("/signin", get(sign_in_page).post(sign_in))
        .with_state(access.clone());
    Router::new()
        .route("/", get(fleet))
        .route("/jobs/{job}", get(job_page))
        .route("/api/fleet", get(fleet_json))
        .route("/api/jobs/{job}", get(job_json))
        .route("/usage", get(usage_page))
        .route("/api/usage", get(usage_json))
        .route("/metrics", get(prometheus))
        .route("/healthz", get(healthz))
        .route("/act/worker/{worker}/{command}", post(act_worker))
        .route("/act/machine/{machine}/release", post(act_release))
        .route("/act/job/{job}/{action}", post(act_job))
        .with_state(Http {
            view: b.view,
            js: b.js,
            client: b.client,
            store: b.store,
            work: b.work,
            ledger_status,
            ledger,
        })
        .merge(sign_in_routes)
        .layer(axum::middleware::from_fn_with_state(
            access,
            super::access::guard,
        ))
        // Form posts and API bodies are small.
        .layer(axum::extract::DefaultBodyLimit::max(16 * 1024))
}

/// Binds `addr` and serves until `stop`; returns the bound address and the
/// serving task. With `ledger_url` (the watchdog's `--ledger`), `/usage`
/// reads that ledger and `/metrics` reports `ledger_status`.
pub async fn serve(
    addr: &str,
    backends: Backends,
    ledger_status: Arc<LedgerStatus>,
    ledger_url: Option<String>,
    access: Arc<HttpAccess>,
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
    if !access.can_admit_anyone() {
        tracing::warn!(listen = %local,
            "the dashboard and /metrics need a credential and none is set up: every request but /healthz is refused; give --http-access FILE (tokens from `minions admin add-viewer`), --http-trust-header, or --http-open to serve them to anyone who can reach them");
    }
    let tls = match &access.tls {
        Some((cert, key)) => Some(super::tls::acceptor(cert, key)?),
        None => None,
    };
    let app = router(backends, ledger_status, ledger_url, access)
        .into_make_service_with_connect_info::<super::access::Peer>();
    let task = match tls {
        None => tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
            {
                tracing::error!(error = %e, "dashboard server stopped");
            }
        }),
        Some(acceptor) => {
            let listener = super::tls::TlsListener::new(listener, acceptor).map_err(|source| {
                HttpError::Bind {
                    addr: addr.to_owned(),
                    source,
                }
            })?;
            tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await
                {
                    tracing::error!(error = %e, "dashboard server stopped");
                }
            })
        }
    };
    Ok((local, task))
}
