//! macOS `powermetrics`: CPU and GPU power, read as root.
//!
//! `powermetrics` needs root. A worker running as root on macOS keeps
//! `powermetrics --samplers cpu_power,gpu_power -i 1000` running as a child
//! and reads its text: each sample starts with a `*** Sampled system
//! activity (…) (1002.90ms elapsed) ***` line, and Apple Silicon prints
//! `CPU Power: N mW`, `GPU Power: N mW`, `ANE Power: N mW` and `Combined
//! Power (CPU + GPU + ANE): N mW` in it (Intel Macs print `Intel energy
//! model derived package power (CPUs+GT+SA): N W`). The combined power times
//! the sample's elapsed time (else the 1000 ms asked for) is the sample's
//! energy; a sample without the combined line counts CPU plus GPU.
//!
//! Without root the worker does not run it and uses the estimate (see
//! [`super::estimate`]). IOReport, the private framework that tools such as
//! macmon read without root, is not read yet.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, ChildStdout};

use super::bounded::{BoundedLines, command_output};
use super::error::EnergyError;
use super::track::Reading;

/// The sample interval asked of `powermetrics`.
pub(crate) const INTERVAL: Duration = Duration::from_millis(1000);

/// The arguments: CPU and GPU power every [`INTERVAL`], line-buffered
/// (`-b 1`) so that each sample arrives when printed, not when a pipe
/// buffer fills.
pub(crate) const ARGS: [&str; 6] = ["--samplers", "cpu_power,gpu_power", "-i", "1000", "-b", "1"];

/// The longest line read; longer ones are skipped (the lines wanted are
/// short; residency lines of large chips run to a few hundred bytes).
const MAX_LINE: usize = 4096;

/// The line that starts a sample.
const SAMPLE_HEADER: &str = "*** Sampled system activity";
/// Apple Silicon's total of the three.
const COMBINED: &str = "Combined Power (CPU + GPU + ANE)";
/// Intel Macs' package power.
const INTEL_PACKAGE: &str = "Intel energy model derived package power (CPUs+GT+SA)";

/// One sample's power.
#[derive(Debug, Clone, PartialEq)]
pub struct PowerSample {
    /// Power over the sample, watts (combined, else CPU + GPU).
    pub watts: f64,
    /// The sample's length, seconds.
    pub seconds: f64,
    /// `CPU Power`, watts, when printed.
    pub cpu_watts: Option<f64>,
    /// `GPU Power`, watts, when printed.
    pub gpu_watts: Option<f64>,
}

impl PowerSample {
    /// The sample's energy, joules.
    pub fn joules(&self) -> f64 {
        self.watts * self.seconds
    }
}

/// `label: N mW` (or `N W`, or without the space) as watts; `None` for any
/// other line, or a value that is negative or not a number.
pub(crate) fn power_value(line: &str, label: &str) -> Option<f64> {
    let rest = line.trim().strip_prefix(label)?.strip_prefix(':')?.trim();
    let split = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, unit) = rest.split_at(split);
    let v = number
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)?;
    match unit.trim() {
        "mW" => Some(v / 1000.0),
        "W" => Some(v),
        _ => None,
    }
}

/// The `(N ms elapsed)` of a sample header, seconds.
pub(crate) fn elapsed_seconds(header: &str) -> Option<f64> {
    let before = &header[..header.find("ms elapsed)")?];
    let number = before[before.rfind('(')? + 1..].trim();
    let ms = number.parse::<f64>().ok()?;
    (ms.is_finite() && ms > 0.0 && ms < 3_600_000.0).then_some(ms / 1000.0)
}

/// Reads `powermetrics` text a line at a time and gives one
/// [`PowerSample`] per sample.
#[derive(Debug, Clone)]
pub struct Parser {
    interval: f64,
    elapsed: Option<f64>,
    cpu: Option<f64>,
    gpu: Option<f64>,
    /// This sample gave its power already (the GPU section repeats `GPU
    /// Power` after the combined line).
    done: bool,
}

impl Parser {
    /// A parser for samples of `interval` when a header does not say.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval: interval.as_secs_f64(),
            elapsed: None,
            cpu: None,
            gpu: None,
            done: false,
        }
    }

    /// Takes one line; returns a sample when one is complete.
    pub fn line(&mut self, line: &str) -> Option<PowerSample> {
        let line = line.trim();
        if line.starts_with(SAMPLE_HEADER) {
            let previous = self.close();
            self.elapsed = elapsed_seconds(line);
            return previous;
        }
        if self.done {
            return None;
        }
        if let Some(w) = power_value(line, COMBINED).or_else(|| power_value(line, INTEL_PACKAGE)) {
            self.done = true;
            return Some(self.sample(w));
        }
        if self.cpu.is_none() {
            self.cpu = power_value(line, "CPU Power");
        }
        if self.gpu.is_none() {
            self.gpu = power_value(line, "GPU Power");
        }
        None
    }

    /// The end of the text: the last sample, if it had no combined line.
    pub fn finish(&mut self) -> Option<PowerSample> {
        self.close()
    }

    fn sample(&self, watts: f64) -> PowerSample {
        PowerSample {
            watts,
            seconds: self.elapsed.unwrap_or(self.interval),
            cpu_watts: self.cpu,
            gpu_watts: self.gpu,
        }
    }

    /// Ends a sample: CPU plus GPU when it printed no combined line.
    fn close(&mut self) -> Option<PowerSample> {
        let out = match (self.done, self.cpu, self.gpu) {
            (false, Some(c), g) => Some(self.sample(c + g.unwrap_or(0.0))),
            (false, None, Some(g)) => Some(self.sample(g)),
            _ => None,
        };
        self.elapsed = None;
        self.cpu = None;
        self.gpu = None;
        self.done = false;
        out
    }
}

/// Whether this process runs as root (`id -u` prints 0).
pub(crate) async fn running_as_root() -> Result<bool, EnergyError> {
    let out = command_output("id", &["-u"], Duration::from_secs(2), 64).await?;
    Ok(out.trim() == "0")
}

/// A running `powermetrics` child and the energy it has shown, as a
/// cumulative counter. Dropping it kills the child.
#[derive(Debug)]
pub struct Powermetrics {
    _child: Child,
    lines: BoundedLines<ChildStdout>,
    parser: Parser,
    joules: f64,
}

impl Powermetrics {
    /// Starts `powermetrics --samplers cpu_power,gpu_power -i 1000 -b 1`.
    pub fn spawn() -> Result<Self, EnergyError> {
        let mut child = tokio::process::Command::new("powermetrics")
            .args(ARGS)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| EnergyError::tool("powermetrics", format!("cannot run it: {e}")))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| EnergyError::tool("powermetrics", "no standard output"))?;
        Ok(Self {
            _child: child,
            lines: BoundedLines::new(stdout, MAX_LINE),
            parser: Parser::new(INTERVAL),
            joules: 0.0,
        })
    }

    /// The next sample as the counter; `None` when `powermetrics` has
    /// ended. Cancel safe (no line read is lost).
    pub async fn next(&mut self) -> Result<Option<Reading>, EnergyError> {
        loop {
            let line = self
                .lines
                .next_line()
                .await
                .map_err(|e| EnergyError::tool("powermetrics", format!("reading it: {e}")))?;
            let sample = match line {
                Some(l) => self.parser.line(&l),
                None => match self.parser.finish() {
                    Some(s) => Some(s),
                    None => return Ok(None),
                },
            };
            if let Some(s) = sample {
                self.joules += s.joules();
                return Ok(Some(Reading {
                    at: Instant::now(),
                    joules: self.joules,
                    watts: s.watts,
                }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real `powermetrics` output (see its `# source:` line).
    const M4_MAX: &str = include_str!("../../tests/fixtures/energy/powermetrics-m4-max.txt");

    fn fixture_body() -> &'static str {
        match M4_MAX.split_once('\n') {
            Some((first, rest)) if first.starts_with("# source: ") => rest,
            _ => panic!("the fixture's first line must be `# source: …`"),
        }
    }

    fn samples(text: &str) -> Vec<PowerSample> {
        let mut p = Parser::new(INTERVAL);
        let mut out: Vec<PowerSample> = text.lines().filter_map(|l| p.line(l)).collect();
        out.extend(p.finish());
        out
    }

    #[test]
    fn reads_a_real_apple_silicon_sample() {
        let got = samples(fixture_body());
        assert_eq!(got.len(), 1, "{got:?}");
        let s = &got[0];
        assert!((s.watts - 0.983).abs() < 1e-9, "{s:?}");
        assert!((s.seconds - 5.02196).abs() < 1e-9, "{s:?}");
        assert_eq!(s.cpu_watts, Some(0.954));
        // The GPU section's repeated `GPU Power` is not counted again.
        assert_eq!(s.gpu_watts, Some(0.028));
        assert!((s.joules() - 0.983 * 5.02196).abs() < 1e-9);
    }

    #[test]
    fn reads_consecutive_samples() {
        let body = fixture_body();
        let two = format!("{body}{body}");
        let got = samples(&two);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], got[1]);
    }

    #[test]
    fn power_lines() {
        assert_eq!(power_value("CPU Power: 954 mW", "CPU Power"), Some(0.954));
        assert_eq!(power_value("  GPU Power: 28 mW", "GPU Power"), Some(0.028));
        assert_eq!(power_value("CPU Power: 5000mW", "CPU Power"), Some(5.0));
        assert_eq!(power_value("CPU Power: 5.5 W", "CPU Power"), Some(5.5));
        // An Intel Mac's line, from a real capture
        // (randomfoo.net/2013/11/08/more-on-os-x-mavericks-power-usage).
        assert_eq!(
            power_value(
                "Intel energy model derived package power (CPUs+GT+SA): 0.58W",
                INTEL_PACKAGE
            ),
            Some(0.58)
        );
        for bad in [
            "CPU Power: -5 mW",
            "CPU Power: mW",
            "CPU Power: 5 kW",
            "CPU Power: 5",
            "CPU Power 5 mW",
            "ANE Power: 5 mW",
            "CPU Power: 1.2.3 mW",
        ] {
            assert_eq!(power_value(bad, "CPU Power"), None, "{bad}");
        }
    }

    #[test]
    fn sample_headers() {
        assert_eq!(
            elapsed_seconds(
                "*** Sampled system activity (Sat Nov  8 15:54:21 2025 +0900) (5021.96ms elapsed) ***"
            ),
            Some(5.02196)
        );
        assert_eq!(elapsed_seconds("*** Sampled system activity ***"), None);
        assert_eq!(
            elapsed_seconds("*** Sampled system activity (x) (-3ms elapsed) ***"),
            None
        );
    }

    #[test]
    fn a_sample_without_the_combined_line_counts_cpu_and_gpu() {
        let text = "*** Sampled system activity (x) (1000.00ms elapsed) ***\n\
                    CPU Power: 1500 mW\nGPU Power: 500 mW\n\
                    *** Sampled system activity (x) (2000.00ms elapsed) ***\n\
                    CPU Power: 1000 mW\n";
        let got = samples(text);
        assert_eq!(got.len(), 2);
        assert!((got[0].joules() - 2.0).abs() < 1e-9);
        assert!((got[1].joules() - 2.0).abs() < 1e-9);
        // Without a header the asked-for interval is used.
        let got = samples("Combined Power (CPU + GPU + ANE): 2000 mW\n");
        assert_eq!(got.len(), 1);
        assert!((got[0].seconds - 1.0).abs() < 1e-9);
        assert!(samples("nothing here\n").is_empty());
    }
}
