//! The worker's main loop: connect, pull into free slots, drain on shutdown.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use minions_endpoints::{host, nats, store};
use minions_schemas::streams;
use minions_schemas::time::now_ms;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::beats::Beats;
use crate::config::WorkerConfig;
use crate::context::Ctx;
use crate::holds::Holds;
use crate::identity::{Identity, new_worker_id};
use crate::model::{ModelCache, describe_device, select_device};
use crate::running::RunningTable;
use crate::settings::Settings;
use crate::worker_error::WorkerError;
use crate::{control, heartbeat, shard};

/// What a worker reports when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// The worker's id for this run.
    pub worker: String,
    /// Shards finished.
    pub done: u64,
    /// Deliveries that failed.
    pub failed: u64,
    /// Shards handed back unfinished at shutdown, as `job/shard`.
    pub handed_back: Vec<String>,
}

/// Sends the first heartbeat and fails if the server refuses it: a worker
/// whose identity belongs to another machine name would otherwise run
/// shards that no one sees (its heartbeats and events all refused).
async fn check_identity(ctx: &Ctx, interval: Duration, started_ms: u64) -> Result<(), WorkerError> {
    let mut refusals = nats::refusals();
    let subject = minions_schemas::subjects::heartbeat(&ctx.identity.worker_id());
    heartbeat::send(ctx, interval, started_ms, false, heartbeat::memory_mb()).await;
    // A round trip: the server answers after it has judged the heartbeat.
    let _ = ctx.js.get_stream(streams::WORK_STREAM).await;
    let quoted = format!("\"{subject}\"");
    let refused = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            match refusals.recv().await {
                Ok(r) if r.contains(&quoted) => return true,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return false,
            }
        }
    })
    .await
    .unwrap_or(false);
    if refused {
        return Err(WorkerError::Identity {
            subject,
            name: ctx.identity.name.clone(),
        });
    }
    Ok(())
}

/// The memory a model may take under the owner policy's cap: a share of the
/// GPU's memory (CUDA, from nvidia-smi) or of the machine's (CPU, and Apple
/// Silicon's unified memory). `None`: no cap, or the size is unknown.
async fn memory_budget_mb(config: &WorkerConfig, device: &str) -> Option<u64> {
    let pct = config.policy.as_ref()?.max_memory_pct;
    if pct >= 100.0 {
        return None;
    }
    let total_mb = Some(device_memory_mb(device).await).filter(|&mb| mb > 0)?;
    let budget = (total_mb as f64 * pct / 100.0) as u64;
    tracing::info!(total_mb, pct, budget_mb = budget, "model memory cap");
    Some(budget)
}

/// The memory of the device models run on, MB: the GPU's (CUDA, from
/// nvidia-smi), else the machine's (CPU, and Apple Silicon's unified
/// memory); 0 when unknown.
async fn device_memory_mb(device: &str) -> u64 {
    device_memory(device).await.unwrap_or(0)
}

async fn device_memory(device: &str) -> Option<u64> {
    let total_mb = if device.starts_with("cuda") {
        let out = tokio::process::Command::new("nvidia-smi")
            .args(["--query-gpu=memory.total", "--format=csv,noheader,nounits"])
            .output()
            .await
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()?
            .trim()
            .parse::<u64>()
            .ok()?
    } else if cfg!(target_os = "macos") {
        let out = tokio::process::Command::new("sysctl")
            .args(["-n", "hw.memsize"])
            .output()
            .await
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .ok()?
            >> 20
    } else {
        crate::heartbeat::memory_mb().0
    };
    Some(total_mb)
}

/// Runs a worker until `shutdown` is cancelled, then drains: pulls nothing new,
/// lets running shards finish for up to `drain_timeout`, hands back the rest,
/// and returns what happened. How its start came out (the canary's
/// verdict, or the error that stopped it first) is recorded in its cache
/// folder ([`crate::start_record`]).
pub async fn run(
    config: WorkerConfig,
    shutdown: CancellationToken,
) -> Result<RunSummary, WorkerError> {
    let cache_dir = config.cache_dir.clone();
    let ran = serve(config, shutdown).await;
    if let Err(e) = &ran
        && !crate::start_record::recorded_by_me(&cache_dir)
    {
        crate::start_record::write(&cache_dir, false, &e.to_string());
    }
    ran
}

/// [`run`], less the record of a start that failed before the canary.
async fn serve(
    mut config: WorkerConfig,
    shutdown: CancellationToken,
) -> Result<RunSummary, WorkerError> {
    let duty_cycle = config.policy.as_ref().map_or(1.0, |p| p.max_duty_cycle);
    if duty_cycle < 1.0 {
        // Quiet mode rests each slot after its shard in proportion to the
        // shard's compute; a shard pulled beside it would run in that
        // rest. It holds one shard per slot.
        let most = &mut config.generation.max_shards;
        *most = (*most).min(config.slots.max(1));
    }
    let host = host::host_name();
    let name = config.name.clone().unwrap_or_else(|| host.clone());
    let worker = new_worker_id(&name);
    let device = select_device(config.device)?;
    let device_name = describe_device(&device);
    let store = store::open(&config.store_url)?;
    let client = nats::connect(
        &config.nats_url,
        &config.nats_security,
        &format!("minions-worker {worker}"),
    )
    .await?;
    let js = jetstream::new(client.clone());
    let settings = minions_endpoints::streams::ensure(&js, &config.work).await?;
    let (ack_wait, max_deliver) = (settings.ack_wait, settings.max_deliver);
    let cpu_kernels = minions_engine::CpuPath::describe();
    tracing::info!(worker = %worker, host = %host, device = %device_name, cpu_kernels = %cpu_kernels, slots = config.slots,
        nats = %config.nats_url, store = %config.store_url, ack_wait_ms = ack_wait.as_millis() as u64,
        max_deliver, "worker started");

    // What this machine lends to models: the operator's word, else the
    // owner policy's cap; jobs needing more are neither pulled nor loaded.
    let mem_budget_mb = match config.lend_memory_mb {
        Some(mb) => Some(mb),
        None => memory_budget_mb(&config, &device_name).await,
    };
    let lend_mb = match mem_budget_mb {
        Some(mb) => mb,
        None => device_memory_mb(&device_name).await,
    };
    tracing::info!(lend_mb, "memory lent to models");
    let stop_energy = CancellationToken::new();
    let energy =
        crate::energy::EnergyMeter::start(&device_name, config.power_watts, stop_energy.clone())
            .await;
    let chip = crate::chip::detect(&device_name).await;
    let made_by = crate::provenance::detect(&device_name, config.engine_path).await;
    tracing::info!(build = %made_by.build, kernel = %made_by.kernel, "outputs record their maker");
    if minions_engine::kernel_fault() {
        tracing::warn!(
            variable = minions_engine::KERNEL_FAULT_ENV,
            "KERNEL FAULT SWITCH ON: this worker's kernels give wrong answers on purpose, for tests only"
        );
    }
    let perturb = crate::fault::Perturb::from_env();
    if let Some(p) = perturb {
        tracing::warn!(switch = ?p, variable = crate::fault::PERTURB_VAR,
            "FAULT SWITCH ON: this worker perturbs its outputs on purpose, for tests only");
    }
    let pace = crate::pace::Pace::from_env();
    if let Some(p) = &pace {
        tracing::warn!(switch = ?p, variable = crate::pace::PACE_VAR,
            "PACE SWITCH ON: this worker waits on purpose after each shard of one model, for tests only");
    }
    let beats = Arc::new(Beats::default());
    let compute = Arc::new(Semaphore::new(1));
    let runs = crate::shared_run::SharedRuns::new();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        js,
        store: store.clone(),
        cache: ModelCache::new(store, config.cache_dir.clone(), device, config.keep_warm)
            .with_engine_path(config.engine_path)
            .with_budget_mb(mem_budget_mb)
            .with_kv_mb((config.generation.kv_budget_bytes >> 20) as u64),
        packs: crate::pack::Packer::new(
            compute.clone(),
            runs.clone(),
            config.generation.max_shards,
        ),
        compute,
        runs,
        sched: crate::schedule::Scheduler::new(lend_mb, device_name.clone()),
        identity: Identity::new(worker.clone(), name, host, device_name, chip, made_by),
        settings: Settings {
            slots: config.slots,
            max_batch: config.max_batch,
            batch_tokens: config.batch_tokens,
            generation: config.generation,
            ack_wait,
            max_deliver,
            cancel_check: config.cancel_check,
            mem_budget_mb: mem_budget_mb.unwrap_or(0),
            duty_cycle,
            perturb,
            pace,
        },
        holds: Holds::new(beats.clone()),
        running: RunningTable::new(beats.clone()),
        beats,
        energy,
        groups: Default::default(),
    });

    let started_ms = now_ms();
    let stop_control = CancellationToken::new();
    let (ready, listening) = tokio::sync::oneshot::channel();
    let controls = tokio::spawn(control::run(ctx.clone(), stop_control.clone(), ready));
    let _ = listening.await;
    // Admitted: the server takes this identity's heartbeats, then the
    // canary passes. A refused canary leaves at once (the watchdogs need
    // not wait for missed beats); a refused identity cannot beat at all.
    let admitted = match check_identity(&ctx, config.heartbeat_interval, started_ms).await {
        Ok(()) => crate::canary::gate(&ctx, &config.cache_dir)
            .await
            .map_err(|e| (e, true)),
        Err(e) => Err((e, false)),
    };
    match &admitted {
        Ok(verdict) => crate::start_record::write(
            &config.cache_dir,
            true,
            &format!("canary passed, {verdict}"),
        ),
        Err((e, _)) => crate::start_record::write(&config.cache_dir, false, &e.to_string()),
    }
    if let Err((e, leave)) = admitted {
        if leave {
            heartbeat::send_leaving(&ctx, config.heartbeat_interval, started_ms).await;
        }
        stop_control.cancel();
        let _ = controls.await;
        stop_energy.cancel();
        ctx.energy.join().await;
        return Err(e);
    }
    let stop_beats = CancellationToken::new();
    let beats = tokio::spawn(heartbeat::run(
        ctx.clone(),
        config.heartbeat_interval,
        started_ms,
        stop_beats.clone(),
    ));

    if config.policy.is_some() {
        // Lend nothing until the owner policy has read its signals once.
        ctx.holds
            .set_owner(Some("waiting for the first owner reading".to_owned()));
    }
    let owner = config.policy.clone().map(|p| {
        tokio::spawn(crate::owner::controller::run(
            ctx.clone(),
            p,
            stop_control.clone(),
        ))
    });
    let schedule = tokio::spawn(crate::follow_schedule::run(
        ctx.clone(),
        stop_control.clone(),
    ));
    let quarantine = tokio::spawn(crate::quarantine::run(ctx.clone(), stop_control.clone()));
    let groups = tokio::spawn(crate::group::run(ctx.clone(), stop_control.clone()));
    let stop_pulling = shutdown.child_token();
    let mut slots = JoinSet::new();
    // Join slots pull only for the running generation batch, while it has
    // free sequences: at most --max-shards shards are held at once.
    let joins = config.generation.max_shards.saturating_sub(config.slots);
    for slot in 0..config.slots + joins {
        slots.spawn(slot_loop(
            ctx.clone(),
            slot,
            slot >= config.slots,
            config.pull_expires,
            stop_pulling.clone(),
        ));
    }

    shutdown.cancelled().await;
    ctx.holds.set_operator(true);
    let running = ctx.running.in_flight();
    tracing::info!(
        running = running.len(),
        deadline_s = config.drain_timeout.as_secs_f64(),
        "stopping: pulling nothing new, letting running shards finish"
    );
    let drained = tokio::time::timeout(config.drain_timeout, async {
        while slots.join_next().await.is_some() {}
    })
    .await
    .is_ok();
    let mut handed_back = Vec::new();
    if !drained {
        handed_back = ctx
            .running
            .in_flight()
            .iter()
            .map(|f| format!("{}/{}", f.job, f.shard))
            .collect();
        tracing::warn!(shards = ?handed_back, "drain deadline passed; handing back running shards");
        ctx.running.hand_back_all();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while slots.join_next().await.is_some() {}
        })
        .await;
        slots.abort_all();
    }
    stop_beats.cancel();
    let _ = beats.await;
    stop_control.cancel();
    let _ = controls.await;
    let _ = schedule.await;
    let _ = quarantine.await;
    let _ = groups.await;
    if let Some(owner) = owner {
        let _ = owner.await;
    }
    // The sampler's last read goes into the leaving beat.
    stop_energy.cancel();
    ctx.energy.join().await;
    heartbeat::send_leaving(&ctx, config.heartbeat_interval, started_ms).await;
    let summary = RunSummary {
        worker: ctx.identity.worker_id().to_string(),
        done: ctx.running.done(),
        failed: ctx.running.failed(),
        handed_back,
    };
    tracing::info!(
        done = summary.done,
        failed = summary.failed,
        handed_back = summary.handed_back.len(),
        "worker stopped"
    );
    Ok(summary)
}

/// Quiet mode: after `busy_ms` of device work, rest long enough that the
/// device works at most the policy's duty cycle (keeps fans down).
async fn quiet_pause(ctx: &Ctx, busy_ms: u64, stop: &CancellationToken) {
    let duty = ctx.settings.duty_cycle;
    if busy_ms == 0 || duty >= 1.0 {
        return;
    }
    let pause = std::time::Duration::from_secs_f64(busy_ms as f64 / 1000.0 * (1.0 - duty) / duty);
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = tokio::time::sleep(pause) => {}
    }
}

/// How long a slot waits for the server's answer to a pull before it asks
/// again (an answer takes milliseconds; a pull lost in a server restart or a
/// consumer leader's move gets none, and would hold the slot for good).
const PULL_UNANSWERED: std::time::Duration = std::time::Duration::from_secs(5);

/// One slot: picks the job to pull from (the schedule's rule), fetches one
/// shard of it (a waiting check run of it first) without waiting (never more than it can run, so no ack timer
/// starts for a shard that waits in a local buffer), runs it, repeats; waits
/// while the worker is drained or nothing it can run is queued; ends when
/// told to stop pulling. A finished shard's settlement (done event stored,
/// ack confirmed) overlaps the next pull; at most one is outstanding per
/// slot, and the slot ends only after its last one. A join slot pulls only
/// while the running generation batch has room, and only its model's jobs
/// ([`crate::shared_run`]).
async fn slot_loop(
    ctx: Arc<Ctx>,
    slot: usize,
    join: bool,
    idle_wait: std::time::Duration,
    stop_pulling: CancellationToken,
) {
    let mut pulling = ctx.holds.subscribe();
    let mut room = ctx.runs.room();
    let mut settling: Option<tokio::task::JoinHandle<()>> = None;
    let mut previous_team: Option<String> = None;
    while !stop_pulling.is_cancelled() {
        if !*pulling.borrow_and_update() {
            tokio::select! {
                _ = stop_pulling.cancelled() => break,
                _ = pulling.changed() => continue,
            }
        }
        let model = if join {
            let Some(model) = room.borrow_and_update().clone() else {
                tokio::select! {
                    _ = stop_pulling.cancelled() => break,
                    _ = pulling.changed() => {}
                    _ = room.changed() => {}
                }
                continue;
            };
            Some(model)
        } else {
            None
        };
        let Some((job, team)) = ctx.sched.pick(
            ctx.cache.held(),
            ctx.running.mean_shard_ms(),
            previous_team.as_deref(),
            model.as_ref(),
        ) else {
            tokio::select! {
                _ = stop_pulling.cancelled() => break,
                _ = pulling.changed() => {}
                _ = ctx.sched.changed(idle_wait) => {}
            }
            continue;
        };
        // No other extra pull starts until this one's shard has joined.
        let mut claim = join.then(|| ctx.runs.claim());
        // Check runs first, while the schedule says some wait: they run
        // beside the job's shards rather than after its last one.
        let checks = ctx.sched.checks_waiting(&job);
        let nothing_there = || {
            if checks {
                ctx.sched.mark_checks_seen(&job);
            } else {
                ctx.sched.mark_empty(&job);
            }
        };
        let consumer = match ctx.sched.consumer(&ctx.js, &job, checks).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(slot, job = %job, checks, error = %e, "job consumer not found");
                nothing_there();
                continue;
            }
        };
        let batch =
            tokio::time::timeout(PULL_UNANSWERED, consumer.fetch().max_messages(1).messages())
                .await;
        let mut batch = match batch {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                tracing::debug!(slot, job = %job, checks, error = %e, "fetch failed");
                ctx.sched.forget(&job);
                nothing_there();
                continue;
            }
            Err(_) => {
                tracing::warn!(slot, job = %job, checks, wait_s = PULL_UNANSWERED.as_secs(),
                    "pull request not sent in time; asking again");
                ctx.sched.forget(&job);
                continue;
            }
        };
        let mut got = false;
        loop {
            // A pull that the server never answers (lost in a restart or a
            // consumer leader's move) must not hold the slot for good: the
            // fetch asks for what is there now, answered in milliseconds.
            let item = match tokio::time::timeout(PULL_UNANSWERED, batch.next()).await {
                Ok(Some(item)) => item,
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(slot, job = %job, checks, wait_s = PULL_UNANSWERED.as_secs(),
                        "pull request unanswered (a server restart or leader move?); asking again");
                    ctx.sched.forget(&job);
                    // Not marked empty: the job may well have shards. A
                    // delivery that arrives late returns after the ack wait.
                    got = true;
                    break;
                }
            };
            match item {
                Ok(msg) if stop_pulling.is_cancelled() || ctx.holds.draining() => {
                    // Arrived as we stopped or drained: hand it straight back.
                    got = true;
                    let _ = msg.ack_with(jetstream::AckKind::Nak(None)).await;
                }
                Ok(msg) => {
                    got = true;
                    previous_team = Some(team.clone());
                    // The delivery says how many of the consumer's messages
                    // are still undelivered: none, and the slots here stop
                    // asking until the next schedule.
                    if msg.info().is_ok_and(|i| i.pending == 0) {
                        nothing_there();
                    }
                    ctx.sched.count(&job, 1);
                    let handled = shard::handle(&ctx, msg, claim.take()).await;
                    ctx.sched.count(&job, -1);
                    if handled.avoided {
                        // The check runs next in line are not for this
                        // machine: its slots pull the job's shards.
                        ctx.sched.mark_checks_seen(&job);
                    }
                    if let Some(prev) = handled.settling.and_then(|s| settling.replace(s)) {
                        let _ = prev.await;
                    }
                    if let Some(rest) = handled.rest {
                        tokio::select! {
                            () = tokio::time::sleep(rest) => {}
                            () = stop_pulling.cancelled() => {}
                        }
                    }
                    quiet_pause(&ctx, handled.busy_ms, &stop_pulling).await;
                }
                Err(e) => tracing::debug!(slot, job = %job, error = %e, "fetch ended"),
            }
        }
        if !got {
            nothing_there();
        }
    }
    if let Some(last) = settling {
        let _ = last.await;
    }
}
