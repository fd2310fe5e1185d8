//! Helpers of the benchmark binaries (`src/bin/bench_*.rs`): flags, and
//! what `/proc` says about a process.

/// Prints a result line to stdout (the tables are the point of a benchmark).
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// The value after flag `name` on the command line.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// CPU seconds (user + system) process `pid` has used, from `/proc`.
pub fn cpu_secs(pid: u32) -> crate::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit(')').next().ok_or("bad /proc stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the name: state is [0]; utime [11], stime [12] (in ticks).
    let utime: f64 = f.get(11).ok_or("no utime")?.parse()?;
    let stime: f64 = f.get(12).ok_or("no stime")?.parse()?;
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.map_or(100.0, |v| v as f64);
    Ok((utime + stime) / tck)
}

/// A `/proc/PID/status` memory figure in MB (`key` is `VmRSS:`, `VmHWM:`...).
pub fn status_mb(pid: u32, key: &str) -> crate::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or_else(|| format!("no {key} in /proc/{pid}/status"))?
        .parse()?;
    Ok(kb / 1024.0)
}
