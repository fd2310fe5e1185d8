//! The watchdog's loop: follow heartbeats, keep the registry, declare silent
//! workers dead and hand their shards back, dead-letter what JetStream gives
//! up on, and track jobs to completion.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use minions_endpoints::{nats, snapshot, store};
use minions_schemas::messages::{Heartbeat, WorkerState};
use minions_schemas::{JobId, WorkerId, decode, limits, streams, subjects};
use tokio_util::sync::CancellationToken;

use crate::dead_letters;
use crate::fleet;
use crate::queue;
use crate::registry::{Observation, Registry, Transition};
use crate::view::View;

/// Why the watchdog could not run.
#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    /// NATS is unreachable, too old, or lacks JetStream.
    #[error(transparent)]
    Nats(#[from] nats::NatsConnectError),
    /// The store URL is wrong.
    #[error(transparent)]
    Store(#[from] store::StoreUrlError),
    /// The streams could not be set up.
    #[error(transparent)]
    Streams(#[from] minions_endpoints::streams::EnsureError),
    /// The dashboard could not start.
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    /// A subscription or stream read failed.
    #[error("cannot follow {what}: {reason}")]
    Follow {
        /// What could not be followed.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

/// Watchdog settings.
#[derive(Debug, Clone)]
pub struct WatchdogConfig {
    /// NATS server URL.
    pub nats_url: String,
    /// NATS credentials and TLS.
    pub nats_security: nats::NatsSecurity,
    /// Replicas of the streams, consumer and registry if this watchdog
    /// creates them.
    pub replicas: usize,
    /// Object store URL (job specs are read and manifests written there).
    pub store_url: String,
    /// Heartbeat intervals a worker may miss before it is declared dead.
    pub missed_beats: u32,
    /// How often silent workers are looked for.
    pub sweep_every: Duration,
    /// A name for this watchdog (logs, registry records).
    pub name: String,
    /// Where to serve the dashboard and `/metrics` (None: not at all).
    pub listen: Option<String>,
    /// Who may read the dashboard and act from it.
    pub http_access: Arc<crate::http::HttpAccess>,
    /// How often the work queue's figures are read.
    pub queue_poll: Duration,
    /// When to checkpoint the folded events (see [`crate::checkpoint`]).
    pub checkpoints: crate::checkpoint::CheckpointPolicy,
    /// How the schedule is published (see [`crate::schedule`]).
    pub schedule: crate::schedule::ScheduleSettings,
    /// Where to keep the usage ledger (PostgreSQL), if anywhere.
    pub ledger: Option<crate::ledger::LedgerSettings>,
    /// Whether workers' done events are checked against their outputs
    /// (see [`crate::tracker::Judge`]); off only for benchmarks.
    pub check_results: bool,
    /// The fleet's share of shards checked by a second machine, parts per
    /// million, for jobs that do not set theirs.
    pub verify_ppm: u32,
    /// The secret that picks checked shards.
    pub verify_key: Vec<u8>,
    /// Strikes that quarantine a machine.
    pub quarantine_after: u32,
    /// How long a strike counts, ms.
    pub strikes_expire_ms: u64,
    /// How long a check round waits for a machine, ms.
    pub checks_wait_ms: u64,
    /// Finished jobs whose summary is kept (see `--finished-jobs-kept`).
    pub finished_kept: usize,
    /// Whether this watchdog forms groups (see [`crate::groups`]).
    pub form_groups: bool,
}

fn follow_err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> WatchdogError {
    move |e| WatchdogError::Follow {
        what,
        reason: e.to_string(),
    }
}

/// Runs until `shutdown` is cancelled. A stop while starting (NATS or the
/// streams slow to answer, as a cluster that has just elected its leader
/// can be) ends at once: nothing is running yet that would need draining.
pub async fn run(config: WatchdogConfig, shutdown: CancellationToken) -> Result<(), WatchdogError> {
    let started = tokio::select! {
        s = start(&config, &shutdown) => s?,
        _ = shutdown.cancelled() => {
            tracing::info!("watchdog stopped while starting");
            return Ok(());
        }
    };
    serve(config, started, shutdown).await
}

/// What [`start`] sets up and [`serve`] runs.
struct Started {
    client: async_nats::Client,
    js: jetstream::Context,
    kv: jetstream::kv::Store,
    work: jetstream::stream::Stream,
    me: WorkerId,
    view: Arc<View>,
    stop_side: CancellationToken,
    stop_events: CancellationToken,
    poller: tokio::task::JoinHandle<()>,
    scheduler: tokio::task::JoinHandle<()>,
    former: Option<tokio::task::JoinHandle<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    tracker: tokio::task::JoinHandle<()>,
    ledger: Option<tokio::task::JoinHandle<()>>,
    cancels: async_nats::Subscriber,
    beats: async_nats::Subscriber,
    advisories: async_nats::Subscriber,
}

/// Connects, sets up the streams, rebuilds the registry and starts the
/// side tasks (queue poller, schedule, dashboard, event tracker, ledger).
async fn start(
    config: &WatchdogConfig,
    shutdown: &CancellationToken,
) -> Result<Started, WatchdogError> {
    let store = store::open(&config.store_url)?;
    let client = nats::connect(
        &config.nats_url,
        &config.nats_security,
        &format!("minions-watchdog {}", config.name),
    )
    .await?;
    let js = jetstream::new(client.clone());
    let settings = streams::WorkSettings {
        replicas: config.replicas,
        ..Default::default()
    };
    let work_settings = minions_endpoints::streams::ensure(&js, &settings).await?;
    let kv = minions_endpoints::streams::workers_kv(&js, config.replicas).await?;
    let work = js
        .get_stream(streams::WORK_STREAM)
        .await
        .map_err(follow_err("the work stream"))?;
    let me = WorkerId::new(config.name.clone())
        .unwrap_or_else(|_| WorkerId::new("watchdog").unwrap_or_else(|_| unreachable!()));

    // Rebuild the view from NATS alone: last beats, and who is already dead.
    let mut registry = Registry::new(config.missed_beats);
    let now = Instant::now();
    let seeded = snapshot::last_heartbeats(&js)
        .await
        .map_err(follow_err("the heartbeat stream"))?;
    for hb in &seeded {
        let id = hb.worker.clone();
        registry.beat(hb.clone(), now);
        if let Some(rec) = fleet::lookup(&kv, &id).await
            && rec.state.is_final()
        {
            registry.mark_dead(&id);
        }
    }
    let view = Arc::new(View::new(config.name.clone(), registry));
    let stop_side = shutdown.child_token();
    let quarantine = minions_endpoints::streams::quarantine_kv(&js, config.replicas).await?;
    let canaries = crate::trust::canary::listen(&client)
        .await
        .map_err(follow_err("canaries"))?;
    let claims = crate::admission::listen(&client)
        .await
        .map_err(follow_err("submit claims"))?;
    let admissions = crate::admission::serve(
        crate::admission::Admitter {
            client: client.clone(),
            js: js.clone(),
            store: store.clone(),
            work: work_settings.clone(),
            me: config.name.clone(),
        },
        claims,
        stop_side.clone(),
    );
    let job_asks = crate::job_requests::listen(&client)
        .await
        .map_err(follow_err("job requests"))?;
    let job_requests = crate::job_requests::serve(
        crate::job_requests::Actor {
            client: client.clone(),
            js: js.clone(),
            store: store.clone(),
            view: view.clone(),
            work: work_settings.clone(),
            me: config.name.clone(),
        },
        job_asks,
        stop_side.clone(),
    );
    let poller = tokio::spawn({
        let (js, view, stop) = (js.clone(), view.clone(), stop_side.clone());
        let nats = client.clone();
        let every = config.queue_poll;
        let canaries = crate::trust::canary::serve(
            client.clone(),
            canaries,
            quarantine.clone(),
            view.clone(),
            config.name.clone(),
            stop.clone(),
        );
        async move {
            tokio::join!(
                queue::poll(js.clone(), view.clone(), every, stop.clone()),
                crate::unheld::watch(js.clone(), nats, view.clone(), every, stop.clone()),
                crate::trust::quarantined::poll(js.clone(), view.clone(), every * 3, stop.clone()),
                crate::recent_actions::poll(js, view, every * 3, stop),
                canaries,
                admissions,
                job_requests,
            );
        }
    });
    let scheduler = tokio::spawn(crate::schedule::run(
        js.clone(),
        client.clone(),
        store.clone(),
        view.clone(),
        crate::schedule::ScheduleSettings {
            work: work_settings.clone(),
            ..config.schedule.clone()
        },
        stop_side.clone(),
    ));
    let former = config.form_groups.then(|| {
        tokio::spawn(crate::groups::run(
            client.clone(),
            store.clone(),
            view.clone(),
            crate::groups::GroupSettings {
                me: config.name.clone(),
                ..Default::default()
            },
            stop_side.clone(),
        ))
    });
    // Shared by the ledger writer (below) and the dashboard's /metrics.
    let ledger_status = Arc::new(crate::ledger::LedgerStatus::default());
    let server = match &config.listen {
        Some(addr) => {
            let (local, task) = crate::http::serve(
                addr,
                crate::http::Backends {
                    view: view.clone(),
                    js: js.clone(),
                    client: client.clone(),
                    store: store.clone(),
                    work: work_settings.clone(),
                },
                ledger_status.clone(),
                config.ledger.as_ref().map(|l| l.url.clone()),
                config.http_access.clone(),
                stop_side.clone(),
            )
            .await?;
            let scheme = if config.http_access.tls.is_some() {
                "https"
            } else {
                "http"
            };
            tracing::info!(url = %format!("{scheme}://{local}/"), "dashboard listening");
            Some(task)
        }
        None => None,
    };
    let cancels = client
        .subscribe(subjects::CANCEL_ALL)
        .await
        .map_err(follow_err("cancellations"))?;

    let beats = client
        .subscribe(subjects::HEARTBEAT_ALL)
        .await
        .map_err(follow_err("heartbeats"))?;
    let advisories = client
        .subscribe(dead_letters::advisory_subject())
        .await
        .map_err(follow_err("advisories"))?;

    // Events go to the job tracker in tasks of their own (restored from the
    // newest checkpoint, then the stream's tail), so a slow store never
    // delays heartbeat handling.
    let stop_events = shutdown.child_token();
    let tracker = crate::events::start(
        &js,
        store.clone(),
        view.clone(),
        config.checkpoints.clone(),
        config.name.clone(),
        crate::tracker::Judge {
            name: me.clone(),
            work: work_settings.clone(),
            check: config.check_results,
            verify_ppm: config.verify_ppm,
            verify_key: config.verify_key.clone(),
            quarantine_after: config.quarantine_after,
            strikes_expire_ms: config.strikes_expire_ms,
            checks_wait_ms: config.checks_wait_ms,
            quarantine: Some(quarantine),
            finished_kept: config.finished_kept,
        },
        stop_events.clone(),
    )
    .await?;

    // The ledger reads the events stream on its own, from its own cursor:
    // a database that is slow or down delays nothing else.
    let ledger = config.ledger.clone().map(|settings| {
        crate::ledger::start(
            js.clone(),
            store.clone(),
            view.clone(),
            settings,
            ledger_status.clone(),
            stop_events.clone(),
        )
    });

    Ok(Started {
        client,
        js,
        kv,
        work,
        me,
        view,
        stop_side,
        stop_events,
        poller,
        scheduler,
        former,
        server,
        tracker,
        ledger,
        cancels,
        beats,
        advisories,
    })
}

/// The loop: heartbeats, advisories, cancellations and sweeps until
/// `shutdown`; then stops the side tasks, each after what it holds.
async fn serve(
    config: WatchdogConfig,
    started: Started,
    shutdown: CancellationToken,
) -> Result<(), WatchdogError> {
    let Started {
        client,
        js,
        kv,
        work,
        me,
        view,
        stop_side,
        stop_events,
        poller,
        scheduler,
        former,
        server,
        tracker,
        ledger,
        mut cancels,
        mut beats,
        mut advisories,
    } = started;
    // State changes are recorded (registry writes, hand-backs) by a task of
    // their own, in order: awaiting a registry round trip in this loop would
    // stall heartbeat intake when a thousand workers change state at once.
    let (changes, mut changed) = tokio::sync::mpsc::unbounded_channel::<(Transition, Heartbeat)>();
    let recorder = {
        let (client, kv, name, view) = (
            client.clone(),
            kv.clone(),
            config.name.clone(),
            view.clone(),
        );
        tokio::spawn(async move {
            while let Some((t, beat)) = changed.recv().await {
                on_transition(&client, &kv, &t, &beat, &name, &view).await;
            }
        })
    };
    let mut sweep = tokio::time::interval(config.sweep_every);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rejoin_told: HashMap<WorkerId, Instant> = HashMap::new();
    tracing::info!(name = %config.name, nats = %config.nats_url, missed_beats = config.missed_beats,
        workers = view.registry().alive(), "watchdog started");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            msg = beats.next() => {
                let Some(msg) = msg else { break };
                let hb = match decode::<Heartbeat>("heartbeat", &msg.payload, limits::MAX_HEARTBEAT_BYTES) {
                    Ok(hb) if subjects::is_heartbeat_of(msg.subject.as_str(), &hb.worker) => hb,
                    Ok(hb) => {
                        tracing::warn!(subject = %msg.subject, worker = %hb.worker, "heartbeat on another worker's subject ignored");
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(subject = %msg.subject, error = %e, "heartbeat does not decode");
                        continue;
                    }
                };
                view.count_heartbeat();
                let seen = view.registry().beat(hb.clone(), Instant::now());
                match seen {
                    Observation::Same => {}
                    Observation::Changed(t) => {
                        let _ = changes.send((t, hb.clone()));
                    }
                    Observation::Fenced(id) => {
                        let due = rejoin_told.get(&id).is_none_or(|t| t.elapsed() > Duration::from_secs(2));
                        if due {
                            tracing::warn!(worker = %id, "a worker declared dead is back; telling it to rejoin as a new session");
                            fleet::tell_rejoin(&client, &id, &config.name).await;
                            rejoin_told.insert(id, Instant::now());
                        }
                    }
                }
            }
            adv = advisories.next() => {
                let Some(adv) = adv else { break };
                if let Err(e) = dead_letters::on_max_deliveries(&js, &work, &adv.payload, &me).await {
                    tracing::warn!(error = %e, "max-deliveries advisory not handled");
                }
            }
            c = cancels.next() => {
                let Some(c) = c else { break };
                if let Some(job) = c.subject.as_str().rsplit('.').next().and_then(|j| JobId::new(j).ok()) {
                    view.jobs().cancel(&job);
                }
            }
            _ = sweep.tick() => {
                let swept: Vec<(Transition, Option<Heartbeat>)> = {
                    let mut reg = view.registry();
                    let ts = reg.sweep(Instant::now());
                    ts.into_iter()
                        .map(|t| {
                            let beat = reg.get(&t.worker).map(|e| e.beat.clone());
                            (t, beat)
                        })
                        .collect()
                };
                for (t, beat) in swept {
                    if let Some(beat) = beat {
                        let _ = changes.send((t, beat));
                    }
                }
                rejoin_told.retain(|_, t| t.elapsed() < Duration::from_secs(60));
            }
        }
    }
    // Record what changed before stopping (a death's hand-back included).
    drop(changes);
    let _ = recorder.await;
    stop_events.cancel();
    stop_side.cancel();
    let _ = tracker.await;
    if let Some(ledger) = ledger {
        let _ = ledger.await;
    }
    let _ = poller.await;
    let _ = scheduler.await;
    if let Some(former) = former {
        let _ = former.await;
    }
    if let Some(server) = server {
        let _ = server.await;
    }
    tracing::info!("watchdog stopped");
    Ok(())
}

async fn on_transition(
    client: &async_nats::Client,
    kv: &jetstream::kv::Store,
    t: &Transition,
    beat: &Heartbeat,
    name: &str,
    view: &View,
) {
    let alive = view.registry().alive();
    match t.to {
        WorkerState::Dead => {
            let n = u32::try_from(beat.in_flight.len()).unwrap_or(u32::MAX);
            match fleet::record(kv, t, beat, n, name).await {
                Ok(true) => {
                    let handed = fleet::hand_back(client, beat).await;
                    tracing::warn!(worker = %t.worker, host = %beat.host, reason = %t.reason, handed_back = handed,
                        workers = alive, "worker declared dead");
                }
                Ok(false) => {
                    tracing::info!(worker = %t.worker, "worker already declared dead by another watchdog")
                }
                Err(e) => {
                    tracing::error!(worker = %t.worker, error = %e, "cannot record the worker's death; not handing back")
                }
            }
        }
        _ => {
            match t.to {
                WorkerState::Joining => {
                    tracing::info!(worker = %t.worker, host = %beat.host, device = %beat.device, workers = alive, "worker joined")
                }
                WorkerState::Left => {
                    tracing::info!(worker = %t.worker, workers = alive, "worker left")
                }
                WorkerState::Suspect => {
                    tracing::warn!(worker = %t.worker, reason = %t.reason, "worker suspect")
                }
                WorkerState::Draining => tracing::info!(worker = %t.worker, "worker draining"),
                _ => tracing::debug!(worker = %t.worker, to = t.to.as_str(), "worker state"),
            }
            if fleet::worth_recording(t)
                && let Err(e) = fleet::record(kv, t, beat, 0, name).await
            {
                tracing::warn!(worker = %t.worker, error = %e, "registry not updated");
            }
        }
    }
}
