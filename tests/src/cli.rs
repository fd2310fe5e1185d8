//! Running the `minions` CLI to completion: raw, checked, `submit`, pushing
//! the tiny model, and polling `status` until a job is done.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{Result, bin, tiny_model, write_corpus};

/// Runs the `minions` CLI to completion.
pub fn minions(args: &[&str], envs: &[(String, String)]) -> Result<Output> {
    Ok(Command::new(bin("minions")?)
        .args(args)
        .envs(envs.iter().cloned())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output()?)
}

/// Runs the `minions` CLI and fails with its stderr unless it succeeds;
/// returns stdout, trimmed.
pub fn minions_ok(args: &[&str], envs: &[(String, String)]) -> Result<String> {
    let out = minions(args, envs)?;
    if !out.status.success() {
        return Err(format!(
            "minions {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Writes a [`tiny_model`] folder `tiny` under `dir`, pushes it under that
/// name with the CLI environment `env`, and returns its folder.
pub fn push_tiny_model(dir: &Path, env: &[(String, String)]) -> Result<PathBuf> {
    let model = tiny_model(dir, "tiny")?;
    minions_ok(
        &[
            "model",
            "push",
            &model.display().to_string(),
            "--name",
            "tiny",
        ],
        env,
    )?;
    Ok(model)
}

/// Pushes a [`tiny_model`] as `tiny` with the CLI environment `env`, writes
/// `records` corpus records to `dir/in.jsonl` and submits them in shards of
/// `shard_size`; returns the job id.
pub fn submit_tiny_job(
    dir: &Path,
    env: &[(String, String)],
    records: usize,
    shard_size: u32,
) -> Result<String> {
    push_tiny_model(dir, env)?;
    let input = dir.join("in.jsonl");
    write_corpus(&input, records)?;
    minions_submit(env, "tiny", &input, shard_size, &[])
}

/// Runs `minions submit` of `input` (a path) to `model` in shards of
/// `shard_size`, `extra` flags appended, with the CLI environment `env`;
/// returns the job id it printed.
pub fn minions_submit(
    env: &[(String, String)],
    model: &str,
    input: &Path,
    shard_size: u32,
    extra: &[&str],
) -> Result<String> {
    let input = input.display().to_string();
    let size = shard_size.to_string();
    let mut args = vec![
        "submit",
        "--model",
        model,
        "--input",
        &input,
        "--shard-size",
        &size,
    ];
    args.extend_from_slice(extra);
    minions_ok(&args, env)
}

/// Polls `minions status JOB --json` with the CLI environment `env` every
/// 200 ms until the job is done and returns that status; a failing status
/// call fails at once, and a job not done within `within` panics with its
/// last status and `context()` (a process's log tail).
#[track_caller]
pub fn wait_done(
    env: &[(String, String)],
    job: &str,
    within: Duration,
    context: impl Fn() -> String,
) -> Result<serde_json::Value> {
    let until = Instant::now() + within;
    loop {
        let s = minions_ok(&["status", job, "--json"], env)?;
        let v: serde_json::Value = serde_json::from_str(&s)?;
        if v["state"] == "done" {
            return Ok(v);
        }
        assert!(Instant::now() < until, "job not done: {s}\n{}", context());
        std::thread::sleep(Duration::from_millis(200));
    }
}
