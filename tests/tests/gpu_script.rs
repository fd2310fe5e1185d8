//! tests/gpu/run.sh, the script a person runs on an NVIDIA machine, in its
//! dry mode on the CPU (`--device cpu --quick`): the same plumbing (a
//! nats-server, a watchdog, one worker, the canary, embedding jobs in f32
//! and f16, generation jobs at two widths, the report's checks) with the
//! workspace's debug binaries and small inputs. On the CPU every answer must
//! equal the committed CPU-path answers (tests/gpu/cpu_answers.jsonl), at
//! each width.

use std::process::Command;

use minions_tests::{Result, bin, real_gguf, real_model_dir, scratch, tool, workspace_root};

#[test]
fn the_gpu_script_runs_end_to_end_on_the_cpu() -> Result<()> {
    let out = scratch("minions-gpu-script-")?;
    let bin_dir = bin("minions-worker")?
        .parent()
        .ok_or("no folder above the worker")?
        .to_path_buf();
    let python = tool("PYTHON", "python3")?;
    let run = Command::new("bash")
        .arg(workspace_root().join("tests/gpu/run.sh"))
        .args(["--device", "cpu", "--quick", "--out"])
        .arg(out.path().join("run"))
        .env("MINIONS_BIN", &bin_dir)
        .env("NATS_SERVER_BIN", tool("NATS_SERVER_BIN", "nats-server")?)
        .env("MINIONS_TEST_MODEL_DIR", real_model_dir()?)
        .env("MINIONS_TEST_GGUF", real_gguf()?)
        .env("PYTHON", python)
        .output()?;
    let text = String::from_utf8_lossy(&run.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "tests/gpu/run.sh failed");
    for want in [
        "canary       ok",
        "Minions f32: ",
        "Minions f16: ",
        "16 of 16 answers equal the CPU path's",
        "batch independence: 16 of 16 answers at --max-seqs 16 equal those at --max-seqs 4",
        "worker peak RSS",
        "== done",
    ] {
        assert!(text.contains(want), "no {want:?} in the report");
    }
    // Two generation widths, each reported.
    assert_eq!(text.matches("generated tokens/s").count(), 2);
    Ok(())
}
