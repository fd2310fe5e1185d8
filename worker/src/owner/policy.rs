//! The owner-first policy: when this machine may lend its GPU, and the gate
//! that turns verdicts into yield and resume decisions without flapping.
//!
//! Written as TOML (`minions-worker --policy FILE`); every field has a
//! default, unknown fields are refused:
//!
//! ```toml
//! signals = ["file:/var/run/minions-owner", "loadavg"]
//! min_input_idle_secs = 300   # lend only after 5 minutes without keyboard or mouse
//! max_gpu_busy_pct = 20       # ... while nothing else keeps the GPU busy
//! require_ac = true           # ... and the machine is on mains power
//! max_load_per_core = 1e9     # ... and the CPU is not busy (off by default: our own work loads it)
//! resume_after_secs = 60      # after a yield, conditions must hold this long again
//! finish_within_secs = 5      # on a yield, keep shards this close to finishing
//! sample_every_ms = 250       # how often signals are read
//! max_duty_cycle = 1.0        # quiet mode: e.g. 0.5 rests as long as it works, to keep the fan down
//! allowed_hours = [0, 24]     # local hours [from, to); [19, 8] lends from 19:00 to 08:00
//! max_memory_pct = 100        # models may take at most this share of the device's memory
//! yield_to_displays = true    # yield while another app keeps the display awake (video, calls)
//! yield_in_low_power_mode = true  # yield while the owner has turned on low-power mode (macOS)
//! ```

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::signal::Observation;

/// The policy. See the module doc for the TOML form and defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Signal sources (see [`super::signal`]).
    pub signals: Vec<String>,
    /// Lend only when input has been idle this long. Too low: the worker
    /// starts while the owner reads a page.
    pub min_input_idle_secs: f64,
    /// Lend only while the GPU is at most this busy with other work.
    pub max_gpu_busy_pct: f64,
    /// Lend only on mains power.
    pub require_ac: bool,
    /// Lend only while the 1-minute load per core is at most this (off by
    /// default: on a CPU-only machine our own inference raises the load and
    /// would make the worker yield to itself).
    pub max_load_per_core: f64,
    /// After a yield, start conditions must hold this long before lending
    /// again. Too low: flapping (shards handed back again and again).
    pub resume_after_secs: f64,
    /// On a yield, shards expected to finish within this many seconds are
    /// kept; the rest are handed back at once.
    pub finish_within_secs: f64,
    /// How often the signals are read, ms. The yield happens within one period.
    pub sample_every_ms: u64,
    /// Quiet mode: the largest share of time the device may work, in (0, 1];
    /// after each shard the worker rests in proportion, and below 1 it
    /// holds one shard per slot (no `--max-shards` beyond `--slots`).
    /// Lower: cooler and quieter, and slower.
    pub max_duty_cycle: f64,
    /// Local hours `[from, to)` in which lending is allowed; `from > to`
    /// wraps past midnight (`[19, 8]`: evenings and nights). `[0, 24]`: always.
    pub allowed_hours: [u32; 2],
    /// Models may take at most this percentage of the device's memory
    /// (unified memory on Apple Silicon); larger ones are handed back for
    /// another machine.
    pub max_memory_pct: f64,
    /// Yield while another app keeps the display awake (video, calls).
    pub yield_to_displays: bool,
    /// Yield while the owner has turned on low-power mode (macOS `low-power`
    /// signal): they asked the machine to save energy, not to lend it.
    pub yield_in_low_power_mode: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            signals: Vec::new(),
            min_input_idle_secs: 300.0,
            max_gpu_busy_pct: 20.0,
            require_ac: true,
            max_load_per_core: 1e9,
            resume_after_secs: 60.0,
            finish_within_secs: 5.0,
            sample_every_ms: 250,
            max_duty_cycle: 1.0,
            allowed_hours: [0, 24],
            max_memory_pct: 100.0,
            yield_to_displays: true,
            yield_in_low_power_mode: true,
        }
    }
}

impl Policy {
    /// Parses a policy file's text.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let p: Policy = toml::from_str(text).map_err(|e| e.to_string())?;
        if p.sample_every_ms == 0 {
            return Err("sample_every_ms must be positive".into());
        }
        if !(p.max_memory_pct > 0.0 && p.max_memory_pct <= 100.0) {
            return Err(format!(
                "max_memory_pct must be in (0, 100], got {}",
                p.max_memory_pct
            ));
        }
        if p.allowed_hours[0] > 23 || p.allowed_hours[1] > 24 {
            return Err(format!(
                "allowed_hours must be [0..=23, 0..=24], got {:?}",
                p.allowed_hours
            ));
        }
        if !(p.max_duty_cycle > 0.0 && p.max_duty_cycle <= 1.0) {
            return Err(format!(
                "max_duty_cycle must be in (0, 1], got {}",
                p.max_duty_cycle
            ));
        }
        for s in &p.signals {
            s.parse::<super::signal::Source>()?;
        }
        Ok(p)
    }

    /// Whether lending is allowed in local `hour` (0–23).
    pub fn hour_allowed(&self, hour: u32) -> bool {
        let [from, to] = self.allowed_hours;
        if from <= to {
            (from..to).contains(&hour)
        } else {
            hour >= from || hour < to
        }
    }

    /// Whether the observation allows lending; the error says why not.
    /// Unknown readings do not block (a desktop has no battery).
    pub fn check(&self, o: &Observation) -> Result<(), String> {
        // A locked screen means the owner is away, whatever the input says.
        if let Some(idle) = o.input_idle_secs
            && idle < self.min_input_idle_secs
            && o.screen_locked != Some(true)
        {
            return Err(format!(
                "owner active: input idle {idle:.0} s < {:.0} s",
                self.min_input_idle_secs
            ));
        }
        if let Some(gpu) = o.gpu_busy_pct
            && gpu > self.max_gpu_busy_pct
        {
            return Err(format!(
                "GPU busy {gpu:.0}% > {:.0}%",
                self.max_gpu_busy_pct
            ));
        }
        if self.require_ac && o.on_battery == Some(true) {
            return Err("on battery".into());
        }
        if self.yield_to_displays && o.display_held == Some(true) {
            return Err("another app keeps the display awake (video or call)".into());
        }
        if o.too_hot == Some(true) {
            return Err("thermal pressure".into());
        }
        if self.yield_in_low_power_mode && o.low_power == Some(true) {
            return Err("low-power mode is on".into());
        }
        if let Some(hour) = o.local_hour
            && !self.hour_allowed(hour)
        {
            return Err(format!(
                "outside allowed hours {:02}:00-{:02}:00",
                self.allowed_hours[0], self.allowed_hours[1]
            ));
        }
        if let Some(load) = o.load_per_core
            && load > self.max_load_per_core
        {
            return Err(format!(
                "CPU load {load:.2} per core > {:.2}",
                self.max_load_per_core
            ));
        }
        Ok(())
    }
}

/// A decision of the [`Gate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Stop lending now, for this reason.
    Yield(String),
    /// Start lending again.
    Resume,
}

/// Turns a stream of verdicts into yield/resume decisions: yield at the
/// first failing verdict; after a yield, resume only once verdicts have
/// passed without a break for `resume_after`.
#[derive(Debug)]
pub struct Gate {
    lending: bool,
    yielded_once: bool,
    ok_since: Option<Instant>,
    resume_after: Duration,
}

impl Gate {
    /// A gate that has not decided yet; the first passing verdict lends at once.
    pub fn new(resume_after: Duration) -> Self {
        Self {
            lending: false,
            yielded_once: false,
            ok_since: None,
            resume_after,
        }
    }

    /// Whether the machine is lent now.
    pub fn lending(&self) -> bool {
        self.lending
    }

    /// Applies one verdict taken at `now`.
    pub fn update(&mut self, verdict: &Result<(), String>, now: Instant) -> Option<Change> {
        match (self.lending, verdict) {
            (true, Ok(())) => None,
            (true, Err(reason)) => {
                self.lending = false;
                self.yielded_once = true;
                self.ok_since = None;
                Some(Change::Yield(reason.clone()))
            }
            (false, Err(_)) => {
                self.ok_since = None;
                None
            }
            (false, Ok(())) => {
                let since = *self.ok_since.get_or_insert(now);
                if !self.yielded_once || now.duration_since(since) >= self.resume_after {
                    self.lending = true;
                    self.ok_since = None;
                    Some(Change::Resume)
                } else {
                    None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_checks_each_condition() {
        let p = Policy::default();
        let ok = Observation {
            input_idle_secs: Some(600.0),
            gpu_busy_pct: Some(5.0),
            on_battery: Some(false),
            ..Default::default()
        };
        assert!(p.check(&ok).is_ok());
        assert!(
            p.check(&Observation::default()).is_ok(),
            "unknown readings do not block"
        );
        let active = Observation {
            input_idle_secs: Some(3.0),
            ..ok.clone()
        };
        assert!(
            p.check(&active)
                .err()
                .unwrap_or_default()
                .contains("owner active")
        );
        let gpu = Observation {
            gpu_busy_pct: Some(90.0),
            ..ok.clone()
        };
        assert!(
            p.check(&gpu)
                .err()
                .unwrap_or_default()
                .contains("GPU busy 90%")
        );
        let locked = Observation {
            input_idle_secs: Some(3.0),
            screen_locked: Some(true),
            ..ok.clone()
        };
        assert!(
            p.check(&locked).is_ok(),
            "a locked screen means the owner is away"
        );
        let battery = Observation {
            on_battery: Some(true),
            ..ok
        };
        assert_eq!(p.check(&battery), Err("on battery".to_owned()));
    }

    #[test]
    fn low_power_mode_blocks_unless_allowed() {
        let low = Observation {
            input_idle_secs: Some(600.0),
            low_power: Some(true),
            ..Default::default()
        };
        let p = Policy::default();
        assert!(p.yield_in_low_power_mode, "on by default");
        assert_eq!(p.check(&low), Err("low-power mode is on".to_owned()));
        let off = Observation {
            low_power: Some(false),
            ..low.clone()
        };
        assert!(p.check(&off).is_ok());
        let lenient = Policy::from_toml("yield_in_low_power_mode = false").unwrap_or_default();
        assert!(!lenient.yield_in_low_power_mode);
        assert!(lenient.check(&low).is_ok());
        let e = Policy::from_toml("yield_in_low_power = false")
            .err()
            .unwrap_or_default();
        assert!(e.contains("unknown field"), "{e}");
    }

    #[test]
    fn allowed_hours_wrap_past_midnight() {
        let always = Policy::default();
        assert!((0..24).all(|h| always.hour_allowed(h)));
        let nights = Policy {
            allowed_hours: [19, 8],
            ..Default::default()
        };
        assert!(nights.hour_allowed(23) && nights.hour_allowed(0) && nights.hour_allowed(7));
        assert!(!nights.hour_allowed(8) && !nights.hour_allowed(12) && !nights.hour_allowed(18));
        let o = Observation {
            local_hour: Some(12),
            ..Default::default()
        };
        assert_eq!(
            nights.check(&o),
            Err("outside allowed hours 19:00-08:00".to_owned())
        );
        assert!(Policy::from_toml("allowed_hours = [25, 3]").is_err());
    }

    #[test]
    fn toml_policies() {
        let p = Policy::from_toml("signals = [\"loadavg\"]\nmin_input_idle_secs = 5\n")
            .unwrap_or_default();
        assert_eq!(p.min_input_idle_secs, 5.0);
        assert_eq!(p.resume_after_secs, 60.0, "defaults fill the rest");
        assert!(Policy::from_toml("max_duty_cycle = 0").is_err());
        let e = Policy::from_toml("min_idle = 5").err().unwrap_or_default();
        assert!(e.contains("unknown field"), "{e}");
        let e = Policy::from_toml("signals = [\"bogus\"]")
            .err()
            .unwrap_or_default();
        assert!(e.contains("unknown owner signal"), "{e}");
    }

    #[test]
    fn gate_yields_at_once_and_resumes_after_a_quiet_period() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut g = Gate::new(Duration::from_secs(2));
        assert_eq!(
            g.update(&Ok(()), ms(0)),
            Some(Change::Resume),
            "first pass lends at once"
        );
        assert_eq!(
            g.update(&Err("owner".into()), ms(100)),
            Some(Change::Yield("owner".into()))
        );
        assert_eq!(g.update(&Ok(()), ms(200)), None);
        assert_eq!(g.update(&Ok(()), ms(2100)), None);
        assert_eq!(g.update(&Ok(()), ms(2200)), Some(Change::Resume));
    }

    #[test]
    fn flapping_causes_one_yield_and_no_resume() {
        let t0 = Instant::now();
        let mut g = Gate::new(Duration::from_secs(2));
        g.update(&Ok(()), t0);
        let mut changes = Vec::new();
        for i in 1..=40u64 {
            let v = if i % 2 == 1 {
                Err("owner".to_owned())
            } else {
                Ok(())
            };
            if let Some(c) = g.update(&v, t0 + Duration::from_millis(200 * i)) {
                changes.push(c);
            }
        }
        assert_eq!(changes, vec![Change::Yield("owner".into())]);
    }
}
