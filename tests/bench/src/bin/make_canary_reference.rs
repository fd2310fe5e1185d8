//! Makes the canary's known answer, `schemas/fixtures/canary.json`: the
//! canary model (weights from its fixed seed) run on the CPU's portable
//! path, at every precision, and the speech canary's logits (its tiny
//! Whisper on the same path). Run once, when the canary or the embedding or
//! speech family's arithmetic changes, and commit the file:
//!
//!   MINIONS_CPU_PATH=portable cargo run --release -p minions-bench --bin make_canary_reference
//!
//! Every worker's canary answer is judged against this file's vectors
//! (cosine per text, the tolerance of sampled checks).

use minions_tests::{Result, workspace_root};
use minions_worker::model::{CPU_PATH_ENV, CpuPath, canary};

fn main() -> Result<()> {
    if CpuPath::get() != CpuPath::Portable {
        return Err(format!(
            "the known answer is made on the portable path: run with {CPU_PATH_ENV}=portable (this run took {})",
            CpuPath::get().name()
        )
        .into());
    }
    let dir = tempfile::tempdir()?;
    canary::write_model(dir.path())?;
    let answers = canary::run(dir.path(), &candle_core::Device::Cpu, Default::default())?;
    let speech =
        minions_worker::model::speech::canary::run(&candle_core::Device::Cpu, Default::default())?;
    let out = workspace_root().join("schemas/fixtures/canary.json");
    let json = serde_json::json!({
        "made_by": format!("make_canary_reference, cpu, {} path", CpuPath::get().name()),
        "answers": answers,
        "speech": speech,
    });
    std::fs::write(&out, format!("{}\n", serde_json::to_string(&json)?))?;
    let dims: Vec<String> = answers
        .iter()
        .chain(std::iter::once(&speech))
        .map(|a| format!("{} ({} values of {})", a.precision, a.data.len(), a.dim))
        .collect();
    let mut stdout = std::io::stdout().lock();
    std::io::Write::write_all(
        &mut stdout,
        format!("wrote {}: {}\n", out.display(), dims.join(", ")).as_bytes(),
    )?;
    Ok(())
}
