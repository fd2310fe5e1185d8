//! Which meter a worker reads, chosen once at start by trying each on this
//! machine, never by assuming: `nvidia-smi` first for a `cuda:N` device
//! (the GPU draws most of a CUDA worker's energy, which RAPL's CPU packages
//! do not see), then RAPL's package counters, then `powermetrics` on macOS
//! as root, and the estimate when none can be read.

use std::path::Path;
use std::time::Duration;

use super::error::EnergyError;
use super::estimate::PowerModel;
use super::nvidia::{NvidiaSmi, cuda_ordinal};
use super::powermetrics::{self, Powermetrics};
use super::rapl::Rapl;
use super::source::Source;
use super::track::Reading;

/// How long `powermetrics` may take to print its first sample.
const FIRST_SAMPLE: Duration = Duration::from_secs(4);

/// A meter that was tried and not used, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct PassedOver {
    /// The meter.
    pub source: Source,
    /// Why it is not used.
    pub reason: String,
    /// True when the meter is there but this user may not read it (RAPL
    /// without root): the operator can fix that.
    pub needs_permission: bool,
}

/// The meter a worker on this machine uses, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The meter.
    pub source: Source,
    /// Why, in words (for the start log and `doctor`).
    pub reason: String,
    /// The better meters tried first, and why each was passed over.
    pub passed_over: Vec<PassedOver>,
    /// The estimate's figure: used when the source is the estimate, and
    /// if the chosen meter stops working.
    pub model: PowerModel,
}

/// A meter, opened.
#[derive(Debug)]
pub(crate) enum Meter {
    /// RAPL's package counters.
    Rapl(Rapl),
    /// `nvidia-smi`, with its first reading.
    Nvidia(NvidiaSmi, Reading),
    /// A running `powermetrics`, with its first sample.
    Powermetrics(Box<Powermetrics>, Reading),
    /// The estimate.
    Estimate,
}

impl Choice {
    fn passed(&mut self, source: Source, e: &EnergyError) {
        self.passed_over.push(PassedOver {
            source,
            reason: e.to_string(),
            needs_permission: matches!(e, EnergyError::RaplPermission { .. }),
        });
    }

    fn skipped(&mut self, source: Source, reason: impl Into<String>) {
        self.passed_over.push(PassedOver {
            source,
            reason: reason.into(),
            needs_permission: false,
        });
    }

    fn chose(&mut self, source: Source, reason: String) {
        self.source = source;
        self.reason = reason;
    }
}

/// Tries the meters for `device` (`cpu`, `metal:N`, `cuda:N`) in order and
/// returns the first that reads, with RAPL looked for under `powercap`;
/// `power_watts` is the operator's figure for the estimate.
pub(crate) async fn choose(
    device: &str,
    power_watts: Option<f64>,
    powercap: &Path,
) -> (Choice, Meter) {
    let model = PowerModel::here(device, power_watts);
    let mut choice = Choice {
        source: Source::Estimate,
        reason: format!("estimate: {}", model.basis),
        passed_over: Vec::new(),
        model,
    };
    let ordinal = cuda_ordinal(device);
    if let Some(n) = ordinal {
        match NvidiaSmi::probe(n).await {
            Ok((smi, first)) => {
                let how = if smi.counts_energy() {
                    "its energy counter (total_energy_consumption)"
                } else {
                    "its power draw integrated over time (no energy counter on this GPU or driver)"
                };
                let reason = format!("nvidia-smi reads GPU {} for {device}: {how}", smi.id());
                choice.chose(Source::NvidiaSmi, reason);
                return (choice, Meter::Nvidia(smi, first));
            }
            Err(e) => choice.passed(Source::NvidiaSmi, &e),
        }
    }
    match Rapl::open(powercap) {
        Ok(rapl) => {
            let reason = format!(
                "{} RAPL package domain(s) under {}: the CPU packages' energy counters",
                rapl.domains(),
                rapl.root().display()
            );
            choice.chose(Source::Rapl, reason);
            return (choice, Meter::Rapl(rapl));
        }
        Err(e) => choice.passed(Source::Rapl, &e),
    }
    if ordinal.is_none() {
        choice.skipped(
            Source::NvidiaSmi,
            format!("device {device} is not a CUDA device"),
        );
    }
    if !cfg!(target_os = "macos") {
        choice.skipped(Source::Powermetrics, "not macOS");
        return (choice, Meter::Estimate);
    }
    match powermetrics::running_as_root().await {
        Ok(true) => match first_sample().await {
            Ok((pm, first)) => {
                let reason = format!(
                    "running as root on macOS: powermetrics' CPU and GPU power over each {} ms sample",
                    powermetrics::INTERVAL.as_millis()
                );
                choice.chose(Source::Powermetrics, reason);
                return (choice, Meter::Powermetrics(Box::new(pm), first));
            }
            Err(e) => choice.passed(Source::Powermetrics, &e),
        },
        Ok(false) => choice.skipped(
            Source::Powermetrics,
            "powermetrics needs root and the worker is not root (IOReport, which tools such as macmon read without root, is not read yet)",
        ),
        Err(e) => choice.passed(Source::Powermetrics, &e),
    }
    (choice, Meter::Estimate)
}

/// Starts `powermetrics` and waits for its first sample.
async fn first_sample() -> Result<(Powermetrics, Reading), EnergyError> {
    let mut pm = Powermetrics::spawn()?;
    match tokio::time::timeout(FIRST_SAMPLE, pm.next()).await {
        Ok(Ok(Some(first))) => Ok((pm, first)),
        Ok(Ok(None)) => Err(EnergyError::tool(
            "powermetrics",
            "ended without printing a sample",
        )),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(EnergyError::tool(
            "powermetrics",
            format!("printed no sample within {} s", FIRST_SAMPLE.as_secs()),
        )),
    }
}

/// Which meter a worker with `device` and `power_watts` would use on this
/// machine, and why (for `minions-worker doctor`). Tries the meters as a
/// worker does; a `powermetrics` started to try it is stopped again.
pub async fn describe(device: &str, power_watts: Option<f64>) -> Choice {
    choose(device, power_watts, Path::new(super::rapl::POWERCAP_ROOT))
        .await
        .0
}

#[cfg(test)]
mod tests {
    use super::*;

    type Res = Result<(), Box<dyn std::error::Error>>;

    #[tokio::test]
    async fn without_any_meter_the_estimate_is_chosen() -> Res {
        let tmp = tempfile::tempdir()?;
        let (choice, meter) = choose("cpu", Some(42.0), &tmp.path().join("powercap")).await;
        if cfg!(target_os = "macos") && choice.source == Source::Powermetrics {
            return Ok(()); // a Mac running the tests as root
        }
        assert_eq!(choice.source, Source::Estimate);
        assert!(matches!(meter, Meter::Estimate));
        assert_eq!(choice.model.watts, 42.0);
        assert!(choice.reason.contains("--power-watts"), "{}", choice.reason);
        let rapl = &choice.passed_over[0];
        assert_eq!(rapl.source, Source::Rapl);
        assert!(
            rapl.reason.contains("no RAPL package domains"),
            "{}",
            rapl.reason
        );
        assert!(!rapl.needs_permission);
        assert!(
            choice
                .passed_over
                .iter()
                .any(|p| p.source == Source::NvidiaSmi && p.reason.contains("not a CUDA device"))
        );
        Ok(())
    }

    #[test]
    fn unreadable_rapl_is_flagged_for_the_operator() {
        let mut c = Choice {
            source: Source::Estimate,
            reason: String::new(),
            passed_over: Vec::new(),
            model: PowerModel::for_device("cpu", None, 1, false),
        };
        let denied = EnergyError::RaplPermission {
            path: "/sys/class/powercap/intel-rapl:0/energy_uj".into(),
        };
        c.passed(Source::Rapl, &denied);
        c.passed(
            Source::Rapl,
            &EnergyError::RaplAbsent {
                root: "/sys/class/powercap".into(),
            },
        );
        assert!(c.passed_over[0].needs_permission);
        assert!(c.passed_over[0].reason.contains("udev"));
        assert!(!c.passed_over[1].needs_permission);
    }

    #[tokio::test]
    async fn readable_rapl_is_chosen_for_a_cpu_device() -> Res {
        let tmp = tempfile::tempdir()?;
        let d = tmp.path().join("intel-rapl:0");
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join("name"), "package-0\n")?;
        std::fs::write(d.join("energy_uj"), "12345\n")?;
        std::fs::write(d.join("max_energy_range_uj"), "262143328850\n")?;
        let (choice, meter) = choose("cpu", None, tmp.path()).await;
        assert_eq!(choice.source, Source::Rapl);
        assert!(matches!(meter, Meter::Rapl(_)));
        assert!(
            choice.reason.contains("1 RAPL package domain"),
            "{}",
            choice.reason
        );
        Ok(())
    }

    /// This machine as it is: with no readable RAPL counters (as on the
    /// machine these tests were written on, which has no
    /// `/sys/class/powercap`) and no CUDA device, the estimate.
    #[tokio::test]
    async fn this_machine_without_rapl_estimates() {
        let root = Path::new(super::super::rapl::POWERCAP_ROOT);
        if Rapl::open(root).is_ok() || cfg!(target_os = "macos") {
            return;
        }
        let choice = describe("cpu", None).await;
        assert_eq!(choice.source, Source::Estimate);
        assert!(choice.reason.starts_with("estimate: "), "{}", choice.reason);
        assert!(choice.model.watts > 0.0);
    }
}
