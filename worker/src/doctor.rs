//! `minions-worker doctor`: what this machine would bring to the fleet and
//! what stands in the way — device, memory, the energy meter (and why),
//! every owner signal (read, or why not), NATS and the store.

use std::fmt::Write;
use std::time::Duration;

use crate::config::WorkerConfig;
use crate::model::{describe_device, select_device};
use crate::owner::Source;

/// Every signal source the worker knows, plus the policy's own.
fn all_sources(config: &WorkerConfig) -> Vec<Source> {
    let mut v = vec![Source::LoadAvg, Source::Logind, Source::NvidiaSmi];
    if cfg!(target_os = "macos") {
        for s in [
            "hid-idle",
            "gpu-util",
            "power",
            "assertions",
            "thermal",
            "screen-lock",
            "low-power",
        ] {
            v.push(Source::MacOs(s));
        }
    }
    if let Some(p) = &config.policy {
        for s in &p.signals {
            if let Ok(src) = s.parse::<Source>()
                && !v.contains(&src)
            {
                v.push(src);
            }
        }
    }
    v
}

/// The energy line: the meter a worker here would read and why; for the
/// estimate, why each meter was passed over, and a hint where the operator
/// can give it access to one (RAPL's counters).
async fn energy(out: &mut String, device: &str, power_watts: Option<f64>) {
    let choice = crate::energy::describe(device, power_watts).await;
    if choice.source.measured() {
        let _ = writeln!(
            out,
            "energy       ok: {} (measured): {}",
            choice.source, choice.reason
        );
    } else {
        let why: Vec<String> = choice
            .passed_over
            .iter()
            .filter(|p| !p.needs_permission)
            .map(|p| format!("{}: {}", p.source, p.reason))
            .collect();
        let _ = writeln!(
            out,
            "energy       {} (not measured): {}; no meter: {}",
            choice.source,
            choice.model.basis,
            why.join("; ")
        );
    }
    for p in choice.passed_over.iter().filter(|p| p.needs_permission) {
        let _ = writeln!(out, "energy       cannot read {}: {}", p.source, p.reason);
    }
}

/// The canary line: the known shard run here and judged against the known
/// answer this build carries (as a worker does when no watchdog answers).
async fn canary(
    out: &mut String,
    device: Option<candle_core::Device>,
    path: minions_engine::EnginePath,
    cache_dir: &std::path::Path,
) {
    let Some(device) = device else {
        let _ = writeln!(out, "canary       not run: no device");
        return;
    };
    let dir = cache_dir.join(format!("canary-doctor-{}", std::process::id()));
    // Its time (the tiny model's loading included) is the user's first
    // reading of the device's speed, e.g. Metal against the CPU.
    let started = std::time::Instant::now();
    let ran = crate::canary::run_on(device, path, &dir).await;
    let took = started.elapsed().as_millis();
    let line = match ran {
        Ok((answers, speech)) => match minions_schemas::canary::judge(&answers, Some(&speech)) {
            Ok(how) => format!("ok: {how}; {took} ms, loading included"),
            Err(why) => format!(
                "FAILED: {why}; this build, device or kernel path gives wrong answers, and a worker here would be refused"
            ),
        },
        Err(e) => format!("FAILED: {e}"),
    };
    let _ = writeln!(out, "canary       {line}");
    if minions_engine::kernel_fault() {
        let _ = writeln!(
            out,
            "fault switch ON: {} is set; this worker's kernels give wrong answers on purpose (tests only): unset it",
            minions_engine::KERNEL_FAULT_ENV
        );
    }
}

/// Runs every check and returns the report; never fails (each problem is a line).
pub async fn report(config: &WorkerConfig) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "minions-worker {} doctor", env!("CARGO_PKG_VERSION"));
    // The energy meter is chosen for the device opened (the CPU when none is).
    let opened = select_device(config.device);
    let device_name = match &opened {
        Ok(d) => {
            let name = describe_device(d);
            let _ = writeln!(out, "device       ok: {name}");
            name
        }
        Err(e) => {
            let _ = writeln!(out, "device       cannot open {:?}: {e}", config.device);
            "cpu".to_owned()
        }
    };
    let _ = writeln!(
        out,
        "cpu kernels  ok: {}",
        minions_engine::CpuPath::describe()
    );
    let path = config.engine_path;
    let _ = match path {
        minions_engine::EnginePath::Fast => writeln!(
            out,
            "engine path  fast: our CPU kernels on the CPU, the device code on a GPU"
        ),
        minions_engine::EnginePath::Device => writeln!(
            out,
            "engine path  device: the code Metal and CUDA run, here on {device_name} ({} or --engine-path)",
            minions_engine::ENGINE_PATH_ENV
        ),
    };
    canary(&mut out, opened.ok(), path, &config.cache_dir).await;
    if let Some(p) = crate::fault::Perturb::from_env() {
        let _ = writeln!(
            out,
            "fault switch ON: {} is set ({p:?}); this worker would perturb its outputs on purpose (tests only): unset it",
            crate::fault::PERTURB_VAR
        );
    }
    if let Some(p) = crate::pace::Pace::from_env() {
        let _ = writeln!(
            out,
            "pace switch ON: {} is set ({p:?}); this worker would wait on purpose after its shards (tests only): unset it",
            crate::pace::PACE_VAR
        );
    }
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let (total, avail) = crate::heartbeat::memory_mb();
    if total > 0 {
        let _ = writeln!(
            out,
            "memory       ok: {avail} MB available of {total} MB; {cores} CPU cores"
        );
    } else {
        let _ = writeln!(
            out,
            "memory       cannot read on this platform; {cores} CPU cores"
        );
    }
    for s in all_sources(config) {
        match s.sample().await {
            Ok(o) => {
                let mut parts = Vec::new();
                if let Some(v) = o.input_idle_secs {
                    parts.push(format!("input idle {v:.0} s"));
                }
                if let Some(v) = o.gpu_busy_pct {
                    parts.push(format!("GPU busy {v:.0}%"));
                }
                if let Some(v) = o.on_battery {
                    parts.push(format!("on battery: {v}"));
                }
                if let Some(v) = o.load_per_core {
                    parts.push(format!("load {v:.2} per core"));
                }
                if let Some(v) = o.display_held {
                    parts.push(format!("display held by an app: {v}"));
                }
                if let Some(v) = o.screen_locked {
                    parts.push(format!("screen locked: {v}"));
                }
                if let Some(v) = o.too_hot {
                    parts.push(format!("too hot: {v}"));
                }
                if let Some(v) = o.low_power {
                    parts.push(format!("low-power mode: {v}"));
                }
                let _ = writeln!(out, "signal       ok: {s}: {}", parts.join(", "));
            }
            Err(e) => {
                let _ = writeln!(out, "signal       cannot read {s}: {}", e.reason);
            }
        }
    }
    energy(&mut out, &device_name, config.power_watts).await;
    match &config.policy {
        Some(p) => {
            let _ = writeln!(
                out,
                "policy       lend after {:.0} s without input, GPU busy ≤ {:.0}%, on AC: {}, hours {:02}-{:02}, resume after {:.0} s",
                p.min_input_idle_secs,
                p.max_gpu_busy_pct,
                p.require_ac,
                p.allowed_hours[0],
                p.allowed_hours[1],
                p.resume_after_secs
            );
        }
        None => {
            let _ = writeln!(
                out,
                "policy       none: the machine is lent whenever the worker runs (--policy FILE sets one)"
            );
        }
    }
    let nats = tokio::time::timeout(
        Duration::from_secs(12),
        minions_endpoints::nats::connect(
            &config.nats_url,
            &config.nats_security,
            "minions-worker doctor",
        ),
    )
    .await;
    match nats {
        Ok(Ok(client)) => {
            let info = client.server_info();
            let _ = writeln!(
                out,
                "nats         ok: {} (nats-server {}, JetStream)",
                config.nats_url, info.version
            );
        }
        Ok(Err(e)) => {
            let _ = writeln!(out, "nats         cannot use {}: {e}", config.nats_url);
        }
        Err(_) => {
            let _ = writeln!(
                out,
                "nats         cannot reach {} within 12 s",
                config.nats_url
            );
        }
    }
    match minions_endpoints::store::open(&config.store_url) {
        Ok(store) => {
            use futures::StreamExt;
            let prefix = object_store::path::Path::from(minions_schemas::keys::MODEL_NAMES);
            let mut list = store.list(Some(&prefix));
            match list.next().await {
                Some(Err(e)) => {
                    let _ = writeln!(out, "store        cannot list {}: {e}", config.store_url);
                }
                _ => {
                    let _ = writeln!(out, "store        ok: {}", config.store_url);
                }
            }
        }
        Err(e) => {
            let _ = writeln!(out, "store        cannot open: {e}");
        }
    }
    out.trim_end().to_owned()
}
