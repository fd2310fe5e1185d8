//! NVIDIA GPUs through `nvidia-smi`.
//!
//! The worker asks for `index,power.draw,total_energy_consumption` of its
//! GPU. `total_energy_consumption` is the board's energy in millijoules
//! since the driver loaded (Volta and newer); where it reads `[N/A]` the
//! worker integrates `power.draw` (watts) over time instead, and on a driver
//! that does not know the field at all (`nvidia-smi` refuses the query) it
//! asks for `index,power.draw` only. `nvidia-smi` is spawned at most every
//! [`super::sampler::NVIDIA_EVERY`], with a timeout and a bound on what it
//! may print, and its output is parsed strictly.
//!
//! Which GPU: the worker's device `cuda:N` is CUDA's N-th visible device.
//! With `CUDA_VISIBLE_DEVICES` set, its N-th entry (an index or a UUID) names
//! the GPU for `nvidia-smi -i`. Without it CUDA orders GPUs fastest first
//! and `nvidia-smi` by PCI bus, which agree on machines with one GPU or
//! identical ones (set `CUDA_DEVICE_ORDER=PCI_BUS_ID` where they do not).

use std::time::{Duration, Instant};

use super::bounded::command_output;
use super::error::EnergyError;
use super::track::Reading;

/// How long one `nvidia-smi` run may take.
const TIMEOUT: Duration = Duration::from_secs(3);

/// The most bytes one `nvidia-smi` run may print (a few lines expected).
const MAX_OUTPUT: usize = 16 * 1024;

/// The query with the energy counter.
const QUERY_ENERGY: &str = "--query-gpu=index,power.draw,total_energy_consumption";
/// The query for drivers that do not know the energy counter.
const QUERY_POWER: &str = "--query-gpu=index,power.draw";

/// One GPU's line of `nvidia-smi --query-gpu=index,power.draw[,total_energy_consumption]
/// --format=csv,noheader,nounits`, e.g. `0, 71.35, 123456789`.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuLine {
    /// `index`: the GPU's number in `nvidia-smi`'s (PCI bus) order.
    pub index: u32,
    /// `power.draw`, watts; `None` for `[N/A]` and the like.
    pub watts: Option<f64>,
    /// `total_energy_consumption`, millijoules since the driver loaded;
    /// `None` for `[N/A]` or when not asked for.
    pub energy_mj: Option<f64>,
}

/// One value: a finite number ≥ 0, or a bracketed word (`[N/A]`,
/// `[Not Supported]`, `[Unknown Error]`) meaning none. Anything else is an
/// error.
fn value(field: &str) -> Result<Option<f64>, EnergyError> {
    let f = field.trim();
    if f.starts_with('[') && f.ends_with(']') {
        return Ok(None);
    }
    match f.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(Some(v)),
        _ => Err(EnergyError::parse("nvidia-smi value", field)),
    }
}

/// Parses one line; `with_energy` says whether the third field was asked for.
pub fn parse_line(line: &str, with_energy: bool) -> Result<GpuLine, EnergyError> {
    let fields: Vec<&str> = line.split(',').collect();
    let want = if with_energy { 3 } else { 2 };
    if fields.len() != want {
        return Err(EnergyError::parse("nvidia-smi line", line));
    }
    let index = fields[0]
        .trim()
        .parse::<u32>()
        .map_err(|_| EnergyError::parse("nvidia-smi GPU index", line))?;
    Ok(GpuLine {
        index,
        watts: value(fields[1])?,
        energy_mj: if with_energy { value(fields[2])? } else { None },
    })
}

/// Parses the output for one GPU (`nvidia-smi -i ID`): exactly one
/// non-empty line, whose index must be `index` when that is known.
pub(crate) fn parse_output(
    text: &str,
    with_energy: bool,
    index: Option<u32>,
) -> Result<GpuLine, EnergyError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let (Some(line), None) = (lines.next(), lines.next()) else {
        return Err(EnergyError::parse("nvidia-smi output (one GPU)", text));
    };
    let gpu = parse_line(line, with_energy)?;
    if index.is_some_and(|i| i != gpu.index) {
        return Err(EnergyError::parse("nvidia-smi output (another GPU)", line));
    }
    Ok(gpu)
}

/// `N` of a device `cuda:N`.
pub fn cuda_ordinal(device: &str) -> Option<u32> {
    device.strip_prefix("cuda:")?.parse().ok()
}

/// The `nvidia-smi -i` id of CUDA device `ordinal`: the `ordinal`-th entry
/// of `CUDA_VISIBLE_DEVICES` (`visible`) when set, else the ordinal. `None`
/// when the variable lists fewer devices.
pub(crate) fn smi_id(ordinal: u32, visible: Option<&str>) -> Option<String> {
    match visible.map(str::trim).filter(|v| !v.is_empty()) {
        None => Some(ordinal.to_string()),
        Some(v) => v
            .split(',')
            .map(str::trim)
            .nth(ordinal as usize)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    }
}

/// How the driver's energy counter maps onto the meter's.
#[derive(Debug, Clone, Copy)]
struct Counter {
    /// The driver's counter where the meter's restarted from, mJ.
    base_mj: f64,
    /// The meter's joules at that point.
    offset_j: f64,
    /// The driver's last reading, mJ.
    last_mj: f64,
}

/// One GPU's meter: a cumulative counter in joules from `nvidia-smi`.
#[derive(Debug)]
pub struct NvidiaSmi {
    /// The id passed to `-i`.
    id: String,
    /// The expected index, when `id` is one.
    index: Option<u32>,
    /// Whether the energy counter is read (else power is integrated).
    with_energy: bool,
    /// Whether the query includes the energy field at all.
    query_energy: bool,
    /// The driver's energy counter as followed so far (energy mode).
    counter: Option<Counter>,
    /// The integrated energy, joules (power mode).
    integrated_j: f64,
    /// The last reading: when, counter (J), watts.
    last: Option<(Instant, f64, f64)>,
}

impl NvidiaSmi {
    /// Finds the GPU of CUDA device `ordinal` and reads it once: an error
    /// when `nvidia-smi` cannot run, does not list it, or gives neither an
    /// energy counter nor a power draw for it.
    pub async fn probe(ordinal: u32) -> Result<(Self, Reading), EnergyError> {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let id = smi_id(ordinal, visible.as_deref()).ok_or_else(|| {
            EnergyError::tool(
                "nvidia-smi",
                format!("CUDA_VISIBLE_DEVICES lists no device {ordinal}"),
            )
        })?;
        let index = id.parse::<u32>().ok();
        let mut smi = Self {
            id,
            index,
            with_energy: true,
            query_energy: true,
            counter: None,
            integrated_j: 0.0,
            last: None,
        };
        let gpu = match smi.query().await {
            Ok(g) => g,
            Err(first) => {
                // Drivers before the energy counter refuse the whole query.
                smi.query_energy = false;
                smi.query().await.map_err(|_| first)?
            }
        };
        smi.with_energy = gpu.energy_mj.is_some();
        if !smi.with_energy && gpu.watts.is_none() {
            return Err(EnergyError::tool(
                "nvidia-smi",
                format!(
                    "GPU {} reports neither total_energy_consumption nor power.draw",
                    smi.id
                ),
            ));
        }
        let reading = smi.take(Instant::now(), &gpu)?;
        Ok((smi, reading))
    }

    /// Whether the GPU's own energy counter is read (else its power draw is
    /// integrated over time).
    pub fn counts_energy(&self) -> bool {
        self.with_energy
    }

    /// The GPU's `nvidia-smi` id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Runs `nvidia-smi` once and returns the counter.
    pub async fn sample(&mut self) -> Result<Reading, EnergyError> {
        let gpu = self.query().await?;
        self.take(Instant::now(), &gpu)
    }

    async fn query(&self) -> Result<GpuLine, EnergyError> {
        let query = if self.query_energy {
            QUERY_ENERGY
        } else {
            QUERY_POWER
        };
        let id = format!("--id={}", self.id);
        let text = command_output(
            "nvidia-smi",
            &[query, "--format=csv,noheader,nounits", &id],
            TIMEOUT,
            MAX_OUTPUT,
        )
        .await?;
        parse_output(&text, self.query_energy, self.index)
    }

    /// Turns a line read at `at` into the counter.
    pub(crate) fn take(&mut self, at: Instant, gpu: &GpuLine) -> Result<Reading, EnergyError> {
        let joules = if self.with_energy {
            let mj = gpu.energy_mj.ok_or_else(|| {
                EnergyError::tool("nvidia-smi", "total_energy_consumption read [N/A]")
            })?;
            let so_far = self.last.map_or(0.0, |(_, j, _)| j);
            let c = self.counter.get_or_insert(Counter {
                base_mj: mj,
                offset_j: 0.0,
                last_mj: mj,
            });
            if mj < c.last_mj {
                // The driver reloaded and its counter restarted: go on
                // from what was counted so far.
                c.offset_j = so_far;
                c.base_mj = mj;
            }
            c.last_mj = mj;
            c.offset_j + (mj - c.base_mj) / 1000.0
        } else {
            let watts = gpu
                .watts
                .ok_or_else(|| EnergyError::tool("nvidia-smi", "power.draw read [N/A]"))?;
            if let Some((t, _, w)) = self.last {
                // Trapezoids between readings.
                let dt = at.saturating_duration_since(t).as_secs_f64();
                self.integrated_j += (w + watts) / 2.0 * dt;
            }
            self.integrated_j
        };
        let watts = match (gpu.watts, self.last) {
            (Some(w), _) => w,
            (None, Some((t, j, _))) => {
                let dt = at.saturating_duration_since(t).as_secs_f64();
                if dt > 0.0 { (joules - j) / dt } else { 0.0 }
            }
            (None, None) => 0.0,
        };
        self.last = Some((at, joules, watts));
        Ok(Reading { at, joules, watts })
    }

    #[cfg(test)]
    fn for_test(with_energy: bool) -> Self {
        Self {
            id: "0".into(),
            index: Some(0),
            with_energy,
            query_energy: true,
            counter: None,
            integrated_j: 0.0,
            last: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Res = Result<(), EnergyError>;

    #[test]
    fn parses_real_lines() -> Res {
        // The format of `nvidia-smi --query-gpu=index,power.draw,
        // total_energy_consumption --format=csv,noheader,nounits`.
        assert_eq!(
            parse_line("0, 71.35, 123456789", true)?,
            GpuLine {
                index: 0,
                watts: Some(71.35),
                energy_mj: Some(123_456_789.0)
            }
        );
        // Pre-Volta boards: no energy counter.
        assert_eq!(
            parse_line("1, 35.12, [N/A]", true)?,
            GpuLine {
                index: 1,
                watts: Some(35.12),
                energy_mj: None
            }
        );
        assert_eq!(
            parse_line("0, [N/A], [N/A]", true)?,
            GpuLine {
                index: 0,
                watts: None,
                energy_mj: None
            }
        );
        assert_eq!(parse_line("3, [Not Supported]", false)?.watts, None);
        assert_eq!(parse_line("2, 250.00", false)?.energy_mj, None);
        Ok(())
    }

    #[test]
    fn refuses_anything_else() {
        for bad in [
            "",
            "0, 71.35",
            "0, 71.35, 1, 2",
            "x, 71.35, 1",
            "-1, 71.35, 1",
            "0, -5, 1",
            "0, 71.35 W, 1",
            "0, NaN, 1",
            "0, inf, 1",
            "Field \"total_energy_consumption\" is not a valid field to query.",
        ] {
            assert!(parse_line(bad, true).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn output_is_one_gpu() -> Res {
        assert_eq!(parse_output("0, 71.35, 5\n", true, Some(0))?.index, 0);
        assert_eq!(parse_output("\n3, 71.35, 5\n\n", true, None)?.index, 3);
        assert!(parse_output("1, 71.35, 5\n", true, Some(0)).is_err());
        assert!(parse_output("0, 1, 5\n1, 2, 6\n", true, Some(0)).is_err());
        assert!(parse_output("", true, Some(0)).is_err());
        Ok(())
    }

    #[test]
    fn which_gpu() {
        assert_eq!(cuda_ordinal("cuda:0"), Some(0));
        assert_eq!(cuda_ordinal("cuda:3"), Some(3));
        assert_eq!(cuda_ordinal("cpu"), None);
        assert_eq!(cuda_ordinal("metal:0"), None);
        assert_eq!(cuda_ordinal("cuda:x"), None);
        assert_eq!(smi_id(1, None).as_deref(), Some("1"));
        assert_eq!(smi_id(1, Some("")).as_deref(), Some("1"));
        assert_eq!(smi_id(0, Some("2,3")).as_deref(), Some("2"));
        assert_eq!(smi_id(1, Some("2, 3")).as_deref(), Some("3"));
        assert_eq!(
            smi_id(0, Some("GPU-8f0a1b2c")).as_deref(),
            Some("GPU-8f0a1b2c")
        );
        assert_eq!(smi_id(2, Some("2,3")), None);
    }

    #[test]
    fn the_energy_counter_counts_from_the_first_reading() -> Res {
        let mut smi = NvidiaSmi::for_test(true);
        let t0 = Instant::now();
        let line = |mj: f64| GpuLine {
            index: 0,
            watts: Some(100.0),
            energy_mj: Some(mj),
        };
        assert_eq!(smi.take(t0, &line(123_456_789.0))?.joules, 0.0);
        let r = smi.take(t0 + Duration::from_secs(2), &line(123_656_789.0))?;
        assert!((r.joules - 200.0).abs() < 1e-9);
        assert!((r.watts - 100.0).abs() < 1e-9);
        // The driver reloaded: its counter restarts, ours goes on.
        let r = smi.take(t0 + Duration::from_secs(4), &line(50_000.0))?;
        assert!((r.joules - 200.0).abs() < 1e-9, "{r:?}");
        let r = smi.take(t0 + Duration::from_secs(6), &line(150_000.0))?;
        assert!((r.joules - 300.0).abs() < 1e-9, "{r:?}");
        Ok(())
    }

    #[test]
    fn without_a_counter_power_is_integrated() -> Res {
        let mut smi = NvidiaSmi::for_test(false);
        let t0 = Instant::now();
        let line = |w: f64| GpuLine {
            index: 0,
            watts: Some(w),
            energy_mj: None,
        };
        assert_eq!(smi.take(t0, &line(50.0))?.joules, 0.0);
        // 2 s from 50 W to 150 W: 200 J by trapezoids.
        let r = smi.take(t0 + Duration::from_secs(2), &line(150.0))?;
        assert!((r.joules - 200.0).abs() < 1e-9);
        assert!((r.watts - 150.0).abs() < 1e-9);
        let missing = GpuLine {
            index: 0,
            watts: None,
            energy_mj: None,
        };
        assert!(smi.take(t0 + Duration::from_secs(3), &missing).is_err());
        Ok(())
    }
}
