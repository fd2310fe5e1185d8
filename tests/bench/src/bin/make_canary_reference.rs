//! Makes the canary's known answer, `schemas/fixtures/canary.json`: the
//! canary model (weights from its fixed seed) run on the CPU's portable
//! path at f32 and int8, and on the device path (candle's code, as GPUs run
//! it) at f16 and bf16, which our CPU kernels run as f32; and the speech
//! canary's logits (its tiny Whisper on the portable path). Run once, when the canary or the embedding or
//! speech family's arithmetic changes, and commit the file:
//!
//!   MINIONS_CPU_PATH=portable cargo run --release -p minions-bench --bin make_canary_reference
//!
//! Every worker's canary answer is judged against this file's vectors
//! (cosine per text, the tolerance of sampled checks).

use minions_tests::{Result, workspace_root};
use minions_worker::model::{CPU_PATH_ENV, CpuPath, EnginePath, Precision, canary};

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
    let cpu = candle_core::Device::Cpu;
    let fast = canary::run(dir.path(), &cpu, EnginePath::Fast)?;
    let device = canary::run(dir.path(), &cpu, EnginePath::Device)?;
    let answers: Vec<_> = fast
        .into_iter()
        .zip(device)
        .map(|(f, d)| match f.precision {
            Precision::F16 | Precision::Bf16 => d,
            _ => f,
        })
        .collect();
    let speech =
        minions_worker::model::speech::canary::run(&candle_core::Device::Cpu, Default::default())?;
    let out = workspace_root().join("schemas/fixtures/canary.json");
    let json = serde_json::json!({
        "made_by": format!(
            "make_canary_reference, cpu, {} path (f16 and bf16: the device path)",
            CpuPath::get().name()
        ),
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
