//! Owner signals: what the machine's owner is doing, read from small sources
//! behind one interface. Each source fills the fields it knows of an
//! [`Observation`]; the policy decides on the merged result.
//!
//! Sources (as written in the policy's `signals` list):
//! - `file:PATH` — a file of `key=value` lines (see [`parse_kv`]), or the
//!   single word `active` or `idle`; any site can drive it from its own tools.
//! - `command:CMD` — a shell command whose output has the same form.
//! - `loadavg` — the 1-minute load average per core (Linux `/proc/loadavg`).
//! - `logind` — the session's idle hint and idle time (Linux `loginctl`).
//! - `nvidia-smi` — NVIDIA GPU utilisation, where the tool is present.
//! - `hid-idle`, `gpu-util`, `power`, `assertions`, `thermal`,
//!   `screen-lock`, `low-power` — macOS sources (see [`super::macos`]).

use std::time::Duration;

/// What the signals say right now. `None`: no source knows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observation {
    /// Seconds since the last keyboard or mouse input.
    pub input_idle_secs: Option<f64>,
    /// GPU utilisation by anything, percent.
    pub gpu_busy_pct: Option<f64>,
    /// Whether the machine runs on battery.
    pub on_battery: Option<bool>,
    /// 1-minute load average per CPU core.
    pub load_per_core: Option<f64>,
    /// Whether the machine is too hot (thermal pressure).
    pub too_hot: Option<bool>,
    /// The local hour of day, 0–23 (always known; filled by the controller).
    pub local_hour: Option<u32>,
    /// Whether another app keeps the display awake (video, calls).
    pub display_held: Option<bool>,
    /// Whether the screen is locked (the owner is away).
    pub screen_locked: Option<bool>,
    /// Whether the owner has turned on low-power mode (macOS).
    pub low_power: Option<bool>,
}

impl Observation {
    /// Fills the fields `other` knows and this one does not.
    pub fn merge(&mut self, other: Observation) {
        self.input_idle_secs = self.input_idle_secs.or(other.input_idle_secs);
        self.gpu_busy_pct = self.gpu_busy_pct.or(other.gpu_busy_pct);
        self.on_battery = self.on_battery.or(other.on_battery);
        self.load_per_core = self.load_per_core.or(other.load_per_core);
        self.too_hot = self.too_hot.or(other.too_hot);
        self.local_hour = self.local_hour.or(other.local_hour);
        self.display_held = self.display_held.or(other.display_held);
        self.screen_locked = self.screen_locked.or(other.screen_locked);
        self.low_power = self.low_power.or(other.low_power);
    }
}

/// Why a source could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("signal {source_name}: {reason}")]
pub struct SignalError {
    /// The source.
    pub source_name: String,
    /// What went wrong.
    pub reason: String,
}

/// One configured source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `file:PATH`.
    File(String),
    /// `command:CMD`.
    Command(String),
    /// `loadavg`.
    LoadAvg,
    /// `logind`.
    Logind,
    /// `nvidia-smi`.
    NvidiaSmi,
    /// A macOS source (`hid-idle`, `gpu-util`, `power`, `assertions`,
    /// `thermal`, `screen-lock`, `low-power`; see [`super::macos`]).
    MacOs(&'static str),
}

impl std::str::FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("file:") {
            return Ok(Self::File(p.to_owned()));
        }
        if let Some(c) = s.strip_prefix("command:") {
            return Ok(Self::Command(c.to_owned()));
        }
        match s {
            "loadavg" => Ok(Self::LoadAvg),
            "logind" => Ok(Self::Logind),
            "nvidia-smi" => Ok(Self::NvidiaSmi),
            "hid-idle" => Ok(Self::MacOs("hid-idle")),
            "gpu-util" => Ok(Self::MacOs("gpu-util")),
            "power" => Ok(Self::MacOs("power")),
            "assertions" => Ok(Self::MacOs("assertions")),
            "thermal" => Ok(Self::MacOs("thermal")),
            "screen-lock" => Ok(Self::MacOs("screen-lock")),
            "low-power" => Ok(Self::MacOs("low-power")),
            _ => Err(format!(
                "unknown owner signal {s:?}; use file:PATH, command:CMD, loadavg, logind, nvidia-smi, \
                 or on macOS hid-idle, gpu-util, power, assertions, thermal, screen-lock, low-power"
            )),
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "file:{p}"),
            Self::Command(c) => write!(f, "command:{c}"),
            Self::LoadAvg => f.write_str("loadavg"),
            Self::Logind => f.write_str("logind"),
            Self::NvidiaSmi => f.write_str("nvidia-smi"),
            Self::MacOs(name) => f.write_str(name),
        }
    }
}

/// Most bytes read from a signal file or command.
const MAX_SIGNAL_BYTES: usize = 64 * 1024;

/// Parses `key=value` lines: `input_idle_secs`, `gpu_busy_pct`,
/// `load_per_core` (numbers), `on_battery`, `too_hot`, `low_power`
/// (true/false). The
/// single word `active` means input idle 0 s; `idle` means idle for ever.
/// Blank lines and `#` comments are skipped; anything else is an error.
pub fn parse_kv(text: &str) -> Result<Observation, String> {
    let mut o = Observation::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line {
            "active" => {
                o.input_idle_secs = Some(0.0);
                continue;
            }
            "idle" => {
                o.input_idle_secs = Some(f64::INFINITY);
                continue;
            }
            _ => {}
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("line {}: expected key=value, got {line:?}", i + 1))?;
        let (k, v) = (k.trim(), v.trim());
        let num = || {
            v.parse::<f64>()
                .map_err(|_| format!("line {}: {k} wants a number, got {v:?}", i + 1))
        };
        let flag = || match v {
            "true" | "yes" | "1" => Ok(true),
            "false" | "no" | "0" => Ok(false),
            _ => Err(format!(
                "line {}: {k} wants true or false, got {v:?}",
                i + 1
            )),
        };
        match k {
            "input_idle_secs" => o.input_idle_secs = Some(num()?),
            "gpu_busy_pct" => o.gpu_busy_pct = Some(num()?),
            "load_per_core" => o.load_per_core = Some(num()?),
            "on_battery" => o.on_battery = Some(flag()?),
            "too_hot" => o.too_hot = Some(flag()?),
            "low_power" => o.low_power = Some(flag()?),
            _ => return Err(format!("line {}: unknown key {k:?}", i + 1)),
        }
    }
    Ok(o)
}

/// Parses `/proc/loadavg` into the 1-minute load per core.
pub fn parse_loadavg(text: &str, cores: usize) -> Option<f64> {
    let one: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some(one / cores.max(1) as f64)
}

/// Parses `loginctl show-session -p IdleHint -p IdleSinceHintMonotonic`
/// output plus the current monotonic clock (µs) into idle seconds.
pub fn parse_logind(text: &str, now_monotonic_us: u64) -> Option<f64> {
    let mut hint = None;
    let mut since = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("IdleHint", v)) => hint = Some(v.trim() == "yes"),
            Some(("IdleSinceHintMonotonic", v)) => since = v.trim().parse::<u64>().ok(),
            _ => {}
        }
    }
    match (hint?, since) {
        (false, _) => Some(0.0),
        (true, Some(s)) if s > 0 => Some(now_monotonic_us.saturating_sub(s) as f64 / 1e6),
        (true, _) => Some(f64::INFINITY),
    }
}

/// Parses `nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits`
/// (one line per GPU) into the busiest GPU's percent.
pub fn parse_nvidia_smi(text: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
}

async fn run(program: &str, args: &[&str], name: &str) -> Result<String, SignalError> {
    let err = |reason: String| SignalError {
        source_name: name.to_owned(),
        reason,
    };
    let out = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::process::Command::new(program)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| err("took longer than 2 s".into()))?
    .map_err(|e| err(format!("cannot run {program}: {e}")))?;
    if !out.status.success() {
        return Err(err(format!("{program} exited with {}", out.status)));
    }
    let mut bytes = out.stdout;
    bytes.truncate(MAX_SIGNAL_BYTES);
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

impl Source {
    /// Reads the source once.
    pub async fn sample(&self) -> Result<Observation, SignalError> {
        let name = self.to_string();
        let err = |reason: String| SignalError {
            source_name: name.clone(),
            reason,
        };
        match self {
            Self::File(path) => {
                let bytes = tokio::fs::read(path)
                    .await
                    .map_err(|e| err(e.to_string()))?;
                let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_SIGNAL_BYTES)])
                    .into_owned();
                parse_kv(&text).map_err(err)
            }
            Self::Command(cmd) => {
                let text = run("sh", &["-c", cmd], &name).await?;
                parse_kv(&text).map_err(err)
            }
            Self::LoadAvg => {
                let text = tokio::fs::read_to_string("/proc/loadavg")
                    .await
                    .map_err(|e| err(e.to_string()))?;
                let cores = std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1);
                let load = parse_loadavg(&text, cores)
                    .ok_or_else(|| err(format!("cannot read {text:?}")))?;
                Ok(Observation {
                    load_per_core: Some(load),
                    ..Default::default()
                })
            }
            Self::Logind => {
                let session = std::env::var("XDG_SESSION_ID")
                    .map_err(|_| err("no XDG_SESSION_ID: not in a login session".into()))?;
                let text = run(
                    "loginctl",
                    &[
                        "show-session",
                        &session,
                        "-p",
                        "IdleHint",
                        "-p",
                        "IdleSinceHintMonotonic",
                    ],
                    &name,
                )
                .await?;
                let uptime = tokio::fs::read_to_string("/proc/uptime")
                    .await
                    .map_err(|e| err(e.to_string()))?;
                let now_us = uptime
                    .split_whitespace()
                    .next()
                    .and_then(|s| s.parse::<f64>().ok())
                    .map_or(0, |s| (s * 1e6) as u64);
                let idle = parse_logind(&text, now_us)
                    .ok_or_else(|| err(format!("cannot read {text:?}")))?;
                Ok(Observation {
                    input_idle_secs: Some(idle),
                    ..Default::default()
                })
            }
            Self::MacOs(source) => {
                let (program, args) =
                    super::macos::command(source).ok_or_else(|| err("unknown source".into()))?;
                let text = run(program, args, &name).await?;
                super::macos::observe(source, &text).ok_or_else(|| {
                    err(format!(
                        "cannot read the output of {program} {}",
                        args.join(" ")
                    ))
                })
            }
            Self::NvidiaSmi => {
                let text = run(
                    "nvidia-smi",
                    &[
                        "--query-gpu=utilization.gpu",
                        "--format=csv,noheader,nounits",
                    ],
                    &name,
                )
                .await?;
                let pct =
                    parse_nvidia_smi(&text).ok_or_else(|| err(format!("cannot read {text:?}")))?;
                Ok(Observation {
                    gpu_busy_pct: Some(pct),
                    ..Default::default()
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_files() {
        let o = parse_kv(
            "# from my script\ninput_idle_secs=12.5\ngpu_busy_pct = 80\non_battery=true\n",
        )
        .unwrap_or_default();
        assert_eq!(o.input_idle_secs, Some(12.5));
        assert_eq!(o.gpu_busy_pct, Some(80.0));
        assert_eq!(o.on_battery, Some(true));
        assert_eq!(parse_kv("active").map(|o| o.input_idle_secs), Ok(Some(0.0)));
        assert_eq!(
            parse_kv("low_power=yes").map(|o| o.low_power),
            Ok(Some(true))
        );
        assert!(parse_kv("idle").is_ok_and(|o| o.input_idle_secs == Some(f64::INFINITY)));
        let e = parse_kv("x=1").err().unwrap_or_default();
        assert!(e.contains("unknown key \"x\""), "{e}");
        let e = parse_kv("gpu_busy_pct=lots").err().unwrap_or_default();
        assert!(e.contains("line 1") && e.contains("number"), "{e}");
    }

    #[test]
    fn linux_readers() {
        assert_eq!(parse_loadavg("1.50 0.80 0.40 2/300 1234\n", 2), Some(0.75));
        assert_eq!(
            parse_logind("IdleHint=no\nIdleSinceHintMonotonic=0\n", 5_000_000),
            Some(0.0)
        );
        assert_eq!(
            parse_logind("IdleHint=yes\nIdleSinceHintMonotonic=1000000\n", 61_000_000),
            Some(60.0)
        );
        assert_eq!(parse_nvidia_smi("3\n97\n"), Some(97.0));
        assert_eq!(parse_nvidia_smi("No devices were found\n"), None);
    }

    #[test]
    fn sources_parse() {
        assert_eq!("file:/tmp/x".parse(), Ok(Source::File("/tmp/x".into())));
        assert_eq!("loadavg".parse(), Ok(Source::LoadAvg));
        assert_eq!("low-power".parse(), Ok(Source::MacOs("low-power")));
        assert_eq!(Source::MacOs("low-power").to_string(), "low-power");
        assert!("bogus".parse::<Source>().is_err());
    }
}
