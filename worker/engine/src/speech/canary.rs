//! The speech canary, run on this machine: a tiny Whisper whose weights
//! follow from [`MODEL_SEED`] and each variable's name, written in
//! CTranslate2's format (f16, as real models ship) and read by the same
//! reader as any model, on the worker's device and kernel path. Two seeded
//! 30-s signals go through the log-mel front end and the encoder side by side;
//! the decoder is fed [`SPEECH_TOKENS`], and its logits at every step are
//! the answer the watchdog judges against the known one
//! ([`minions_schemas::canary`]).

use candle_core::{Device, Tensor};
use minions_schemas::canary::{MODEL_SEED, SPEECH_SIGNALS, SPEECH_TOKENS};
use minions_schemas::messages::{CanaryAnswer, Precision};

use super::ct2::{Ct2File, TinyWhisper, encode_file};
use super::mel::{MelFrontEnd, N_FRAMES, SAMPLE_RATE};
use super::whisper::Whisper;
use crate::canary::{SplitMix, fnv1a};
use crate::{EnginePath, ModelError};

/// Width: two heads of 16.
const WIDTH: u32 = 32;
/// Heads on both sides.
const HEADS: u8 = 2;
/// Layers on each side: two, so that one layer feeds another.
const LAYERS: usize = 2;
/// Mel bands: Whisper's 80, so that the real filter bank is taken.
const MELS: u32 = 80;
/// Vocabulary: the logits per step.
const VOCAB: u32 = 64;
/// Decoder positions.
const TEXT_CTX: u32 = 16;
/// Encoder positions of a 30-s window.
const AUDIO_CTX: u32 = 1500;
/// CTranslate2's type id of f16.
const F16: u8 = 4;
/// Each signal's length: a whole window, so that the audio (not the
/// padding) is what the decoder's cross-attention averages over.
const SIGNAL_SECS: usize = 30;

/// Runs the speech canary on `device`, the code `path` names: one row of
/// logits per signal and decoder step ([`minions_schemas::canary`]).
pub fn run(device: &Device, path: EnginePath) -> Result<CanaryAnswer, ModelError> {
    let file = Ct2File::parse(model_bytes())?;
    let model = Whisper::from_file(&file, device, path.host_kernels(device))?;
    let front = MelFrontEnd::new(MELS as usize)
        .map_err(|e| ModelError::BadInput(format!("the speech canary's front end: {e}")))?;
    let mel: Vec<f32> = (0..SPEECH_SIGNALS)
        .flat_map(|i| front.window(&signal(i)))
        .collect();
    let mel = Tensor::from_vec(mel, (SPEECH_SIGNALS, MELS as usize, N_FRAMES), device)?;
    let encoded = model.encode(&mel)?;
    let mut state = model.start(&encoded)?;
    let mut data = Vec::new();
    let prompt = vec![SPEECH_TOKENS[..3].to_vec(); SPEECH_SIGNALS];
    for row in model.step(&mut state, &prompt)? {
        data.extend(row);
    }
    for &t in &SPEECH_TOKENS[3..] {
        for row in model.step(&mut state, &vec![vec![t]; SPEECH_SIGNALS])? {
            data.extend(row);
        }
    }
    Ok(CanaryAnswer {
        precision: Precision::F32,
        dim: VOCAB,
        data,
    })
}

/// Signal `i`, a whole window at 16 kHz with seeded noise: signal 0 two
/// steady tones, signal 1 a rising chirp that pulses twice a second, so
/// that their spectra share little.
fn signal(i: usize) -> Vec<f32> {
    use std::f64::consts::TAU;
    let mut rng = SplitMix(MODEL_SEED ^ (i as u64 + 1));
    (0..SIGNAL_SECS * SAMPLE_RATE)
        .map(|n| {
            let t = n as f64 / SAMPLE_RATE as f64;
            let s = if i.is_multiple_of(2) {
                0.3 * (TAU * 220.0 * t).sin() + 0.2 * (TAU * 1_375.0 * t).sin()
            } else {
                // 100 Hz rising to 4 kHz over the window.
                let phase = TAU * (100.0 * t + 65.0 * t * t);
                0.5 * phase.sin() * (0.5 + 0.5 * (TAU * 2.0 * t).sin())
            };
            s as f32 + 0.05 * rng.unit()
        })
        .collect()
}

/// The canary model's `model.bin` bytes: every variable drawn in name order
/// from the seed and its name (layer-norm scales near 1, everything else
/// small and centred on 0, the cross-attention and the token embeddings
/// larger), stored as f16.
fn model_bytes() -> Vec<u8> {
    let mut shapes = TinyWhisper {
        width: WIDTH,
        mels: MELS,
        vocab: VOCAB,
        text_ctx: TEXT_CTX,
        audio_ctx: AUDIO_CTX,
        layers: LAYERS,
    }
    .variables();
    shapes.sort();
    let mut vars: Vec<(String, Vec<u32>, u8, Vec<u8>)> = shapes
        .into_iter()
        .map(|(name, dims)| {
            let mut rng = SplitMix(MODEL_SEED ^ fnv1a(name.as_bytes()));
            let (scale, offset) = if name.ends_with("gamma") {
                (0.1, 1.0)
            } else if name.ends_with("bias") || name.ends_with("beta") {
                (0.02, 0.0)
            } else if name.contains("/attention/linear_") {
                // Cross-attention strong enough that the audio, not the
                // tokens alone, sets the logits.
                (0.4, 0.0)
            } else if name.starts_with("decoder/embeddings") {
                // ... and tokens strong enough to move them step by step.
                (0.6, 0.0)
            } else {
                (0.2, 0.0)
            };
            let n: u32 = dims.iter().product();
            let bytes = (0..n)
                .flat_map(|_| half::f16::from_f32(offset + scale * rng.unit()).to_le_bytes())
                .collect();
            (name, dims, F16, bytes)
        })
        .collect();
    vars.push(("encoder/num_heads".into(), vec![], 1, vec![HEADS]));
    vars.push(("decoder/num_heads".into(), vec![], 1, vec![HEADS]));
    let refs: Vec<(&str, Vec<u32>, u8, Vec<u8>)> = vars
        .iter()
        .map(|(n, d, t, b)| (n.as_str(), d.clone(), *t, b.clone()))
        .collect();
    encode_file(&refs, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both paths on this CPU give the known answer; the two signals and
    /// the steps give different logits (a constant answer would let a
    /// broken kernel through).
    #[test]
    fn the_speech_canary_matches_the_known_answer_on_both_paths() -> Result<(), ModelError> {
        let known = minions_schemas::canary::reference().and_then(|r| r.speech.as_ref());
        let Some(known) = known else {
            panic!("the committed canary answer has no speech answer")
        };
        for path in [EnginePath::Fast, EnginePath::Device] {
            let got = run(&Device::Cpu, path)?;
            assert_eq!((got.dim, got.data.len()), (known.dim, known.data.len()));
            let worst = got
                .data
                .chunks_exact(VOCAB as usize)
                .zip(known.data.chunks_exact(VOCAB as usize))
                .map(|(a, b)| {
                    a.iter()
                        .zip(b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0f32, f32::max)
                })
                .fold(0f32, f32::max);
            assert!(worst < 1e-3, "{path} path: logits off by {worst}");
        }
        Ok(())
    }
}
