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

/// Whether `--help` or `-h` is on the command line; prints `usage` when it
/// is, so that a benchmark binary can return before running anything.
pub fn help(usage: &str) -> bool {
    let asked = flag("--help") || flag("-h");
    if asked {
        crate::out!("{}", usage.trim());
    }
    asked
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

/// Number flag `name`, or `default` when absent.
pub fn num(name: &str, default: u64) -> crate::Result<u64> {
    Ok(match arg(name) {
        Some(v) => v.parse()?,
        None => default,
    })
}

/// Whether bare flag `name` is on the command line.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// The command line as run, program paths cut to their file names (for
/// "made by" lines: no machine paths).
pub fn command_line() -> String {
    std::env::args()
        .map(|a| match a.rsplit_once('/') {
            Some((_, file)) => file.to_owned(),
            None => a,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Now, as `YYYY-MM-DD HH:MM` UTC.
pub fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Cores, CPU model, OS and architecture of this machine.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "{cores} cores ({cpu}), {} {}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// Puts `section` into BENCHMARKS.md between `<!-- NAME: begin -->` and
/// `<!-- NAME: end -->` (appended with its markers when absent); returns
/// the file's path.
pub fn write_section(name: &str, section: &str) -> crate::Result<std::path::PathBuf> {
    let begin = format!("<!-- {name}: begin -->");
    let end = format!("<!-- {name}: end -->");
    let path = crate::workspace_root().join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path)?;
    let block = format!("{begin}\n{section}{end}");
    let new = match (text.find(&begin), text.find(&end)) {
        (Some(a), Some(b)) if a < b => {
            format!("{}{block}{}", &text[..a], &text[b + end.len()..])
        }
        _ => format!("{}\n\n{block}\n", text.trim_end()),
    };
    std::fs::write(&path, new)?;
    Ok(path)
}

/// Cuts the inference benchmarks' `n` texts with `tests/bench/texts.py`
/// into `dir/texts.jsonl` (one `{"text": ...}` per line); returns the file
/// and the texts.
pub fn bench_texts(
    python: &std::path::Path,
    n: u64,
    dir: &std::path::Path,
) -> crate::Result<(std::path::PathBuf, Vec<String>)> {
    let path = dir.join("texts.jsonl");
    let status = std::process::Command::new(python)
        .arg(crate::workspace_root().join("tests/bench/texts.py"))
        .arg(&path)
        .arg(n.to_string())
        .status()?;
    if !status.success() {
        return Err(format!("texts.py failed ({status})").into());
    }
    let texts = std::fs::read_to_string(&path)?
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["text"].as_str().map(str::to_owned))
                .ok_or_else(|| format!("bad line in texts: {l}"))
        })
        .collect::<std::result::Result<_, _>>()?;
    Ok((path, texts))
}

/// The Python of the inference benchmarks: `--python PATH`, else
/// `.tools/bench-venv`'s when it exists, else `python3`.
pub fn bench_python() -> std::path::PathBuf {
    let venv = crate::workspace_root().join(".tools/bench-venv/bin/python");
    arg("--python").map_or_else(
        || match venv.exists() {
            true => venv,
            false => std::path::PathBuf::from("python3"),
        },
        std::path::PathBuf::from,
    )
}

/// Waits until `n` workers report in.
pub fn wait_workers(fleet: &crate::Fleet, n: usize) -> crate::Result<()> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let v: serde_json::Value =
            serde_json::from_str(&fleet.cli(&["worker", "list", "--json"])?)?;
        let up = v
            .as_array()
            .map_or(0, |a| a.iter().filter(|w| w["state"] != "dead").count());
        if up >= n {
            return Ok(());
        }
        if std::time::Instant::now() > until {
            return Err(format!("{up} of {n} workers up after 60 s\n{}", fleet.logs()).into());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Submits the texts as job `job` and waits for it: texts/s from submit to
/// done. Checks that every text has its vector.
pub fn job(
    fleet: &crate::Fleet,
    texts: &std::path::Path,
    n: usize,
    job: &str,
    shard: u64,
    precision: &str,
) -> crate::Result<f64> {
    let started = std::time::Instant::now();
    let id = fleet.cli(&[
        "submit",
        "--model",
        "minilm",
        "--input",
        &texts.display().to_string(),
        "--job",
        job,
        "--shard-size",
        &shard.to_string(),
        "--precision",
        precision,
    ])?;
    let status = fleet.wait_job(&id, std::time::Duration::from_secs(3600))?;
    let secs = started.elapsed().as_secs_f64();
    if status["state"] != "done" {
        return Err(format!("job {id} ended {status}").into());
    }
    let npy = fleet.dir.path().join(format!("{job}.npy"));
    fleet.cli(&["collect", &id, "--output", &npy.display().to_string()])?;
    let (rows, _, _) = crate::read_npy_f32(&npy)?;
    if rows != n {
        return Err(format!("job {id}: {rows} vectors for {n} texts").into());
    }
    Ok(n as f64 / secs)
}
