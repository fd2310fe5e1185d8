//! The machine's chip, for the record (heartbeats, the usage ledger): the
//! GPU's name for a CUDA device, else the CPU's brand string (on a Mac,
//! e.g. "Apple M2 Pro"). Empty when the platform does not tell.

use std::time::Duration;

/// The longest name kept.
const MAX_CHIP_CHARS: usize = 128;

/// The chip that runs shards on `device` (`cpu`, `metal:0`, `cuda:1`).
pub(crate) async fn detect(device: &str) -> String {
    let name = match device.strip_prefix("cuda:") {
        Some(index) => gpu_name(index).await,
        None => None,
    };
    let name = match name {
        Some(n) => n,
        None => cpu_name().await.unwrap_or_default(),
    };
    tidy(&name)
}

/// Trims the name, folds runs of spaces and bounds its length.
fn tidy(name: &str) -> String {
    name.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(MAX_CHIP_CHARS)
        .collect()
}

async fn gpu_name(index: &str) -> Option<String> {
    index.parse::<u32>().ok()?;
    let args = ["--query-gpu=name", "--format=csv,noheader", "-i", index];
    crate::energy::command_output("nvidia-smi", &args, Duration::from_secs(5), 4096)
        .await
        .ok()
        .and_then(|out| out.lines().next().map(str::to_owned))
        .filter(|n| !n.trim().is_empty())
}

async fn cpu_name() -> Option<String> {
    if cfg!(target_os = "macos") {
        let args = ["-n", "machdep.cpu.brand_string"];
        return crate::energy::command_output("sysctl", &args, Duration::from_secs(5), 4096)
            .await
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
    }
    let text = tokio::fs::read_to_string("/proc/cpuinfo").await.ok()?;
    model_name(&text)
}

/// The first `model name` of a `/proc/cpuinfo` text.
fn model_name(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_model_comes_from_cpuinfo() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)  Processor\nflags\t: fpu\n";
        assert_eq!(
            model_name(text).map(|n| tidy(&n)).as_deref(),
            Some("Intel(R) Xeon(R) Processor")
        );
        assert_eq!(model_name("processor : 0\n"), None);
        assert_eq!(tidy(&"x".repeat(500)).len(), MAX_CHIP_CHARS);
    }
}
