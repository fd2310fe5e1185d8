//! The speech-to-text family (Whisper, from CTranslate2's model folders):
//! - `audio` — decoding an audio file to 16 kHz mono samples, with limits;
//! - `mel` — Whisper's log-mel front end;
//! - `ct2` — reading CTranslate2's `model.bin` into named tensors;
//! - `whisper` — the encoder and the decoder with its caches;
//! - `decode` — greedy decoding with Whisper's token rules, window by window.

pub mod audio;
pub mod ct2;
pub mod decode;
mod host_attention;
pub mod mel;
pub mod transcribe;
pub mod whisper;

use std::path::Path;

use candle_core::Device;
use tokenizers::Tokenizer;

use crate::{EnginePath, ModelError};
use decode::Specials;
use mel::MelFrontEnd;
use transcribe::{TranscribeOptions, Transcript};
use whisper::Whisper;

/// The largest `tokenizer.json` accepted.
const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

/// A span of a transcript, in text.
#[derive(Clone, Debug, PartialEq)]
pub struct TextSegment {
    /// Start, seconds from the file's start.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// The words, as the model wrote them (usually with a leading space).
    pub text: String,
    /// The tokens they were decoded from, timestamps included.
    pub tokens: Vec<u32>,
}

/// A file's transcript, in text.
#[derive(Clone, Debug, PartialEq)]
pub struct TextTranscript {
    /// The segments' texts joined, trimmed.
    pub text: String,
    /// The spoken language's code (`en`, …), where the model names one.
    pub language: Option<String>,
    /// Segments with text, in order.
    pub segments: Vec<TextSegment>,
    /// 30-second windows decoded.
    pub windows: usize,
}

/// A Whisper model folder in CTranslate2's format, loaded: the network,
/// its special tokens and its tokenizer.
pub struct SpeechModel {
    whisper: Whisper,
    mel: MelFrontEnd,
    specials: Specials,
    tokenizer: Tokenizer,
}

impl SpeechModel {
    /// Loads `dir` (`model.bin`, `config.json`, `vocabulary.txt`,
    /// `tokenizer.json`) onto `device`, to run the code `path` names.
    pub fn load(dir: &Path, device: &Device, path: EnginePath) -> Result<Self, ModelError> {
        let whisper = Whisper::load(dir, device, path.host_kernels(device))?;
        let specials = Specials::load(dir, whisper.dims().vocab)?;
        let tokenizer = load_tokenizer(dir)?;
        let mel = MelFrontEnd::new(whisper.dims().n_mels)
            .map_err(|e| ct2_invalid(format!("model.bin: {e}")))?;
        Ok(Self {
            whisper,
            mel,
            specials,
            tokenizer,
        })
    }

    /// Checks a model folder without building the network, as `model push`
    /// does before storing it: `model.bin` parses as CTranslate2's Whisper
    /// spec with every size readable, and the vocabulary, `config.json` and
    /// `tokenizer.json` agree with it. Returns the sizes.
    pub fn inspect(dir: &Path) -> Result<SpeechSummary, ModelError> {
        let f = ct2::Ct2File::open(&dir.join("model.bin"))?;
        let dims = whisper::WhisperDims::read(&f)?;
        let specials = Specials::load(dir, dims.vocab)?;
        load_tokenizer(dir)?;
        Ok(SpeechSummary {
            languages: specials.languages.len(),
            dims,
        })
    }

    /// The network.
    pub fn whisper(&self) -> &Whisper {
        &self.whisper
    }

    /// The special tokens.
    pub fn specials(&self) -> &Specials {
        &self.specials
    }

    /// The text of `tokens`, special tokens and timestamps left out.
    pub fn text(&self, tokens: &[u32]) -> Result<String, ModelError> {
        let ids: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| t < self.specials.eot)
            .collect();
        self.tokenizer
            .decode(&ids, false)
            .map_err(|e| ModelError::BadInput(format!("cannot decode tokens: {e}")))
    }

    /// Transcribes `files`, 16 kHz mono samples (see
    /// [`transcribe::transcribe`]), handing each finished one to `done` in
    /// text.
    pub fn transcribe(
        &self,
        files: &[&[f32]],
        opts: &TranscribeOptions,
        stop: &dyn Fn() -> bool,
        done: &mut dyn FnMut(usize, Result<TextTranscript, ModelError>),
    ) -> Result<(), ModelError> {
        transcribe::transcribe(
            &self.whisper,
            &self.specials,
            &self.mel,
            files,
            opts,
            stop,
            &mut |i, t| done(i, self.to_text(t)),
        )
    }

    /// Text for a transcript: segments with no text or no length dropped,
    /// as Whisper's own loop drops them.
    pub fn to_text(&self, t: Transcript) -> Result<TextTranscript, ModelError> {
        let mut segments = Vec::with_capacity(t.segments.len());
        for s in &t.segments {
            let text = self.text(&s.tokens)?;
            if s.start == s.end || text.trim().is_empty() {
                continue;
            }
            segments.push(TextSegment {
                start: s.start,
                end: s.end,
                text,
                tokens: s.tokens.clone(),
            });
        }
        let text = segments
            .iter()
            .map(|s| s.text.as_str())
            .collect::<String>()
            .trim()
            .to_string();
        Ok(TextTranscript {
            text,
            language: t
                .language
                .and_then(|l| self.specials.language_code(l))
                .map(str::to_string),
            segments,
            windows: t.windows,
        })
    }
}

/// What [`SpeechModel::inspect`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpeechSummary {
    /// The network's sizes.
    pub dims: whisper::WhisperDims,
    /// Languages the model names (0 for an English-only model).
    pub languages: usize,
}

impl crate::Model for SpeechModel {
    fn family(&self) -> minions_schemas::messages::ModelFamily {
        minions_schemas::messages::ModelFamily::WhisperSpeech
    }
}

/// `dir/tokenizer.json`, size-checked.
fn load_tokenizer(dir: &Path) -> Result<Tokenizer, ModelError> {
    let tpath = dir.join("tokenizer.json");
    let len = std::fs::metadata(&tpath)
        .map_err(|e| ct2_invalid(format!("cannot read tokenizer.json: {e}")))?
        .len();
    if len > MAX_TOKENIZER_BYTES {
        return Err(ct2_invalid(format!(
            "tokenizer.json is {len} bytes, over {MAX_TOKENIZER_BYTES}"
        )));
    }
    Tokenizer::from_file(&tpath).map_err(|e| ct2_invalid(format!("tokenizer.json: {e}")))
}

fn ct2_invalid(reason: String) -> ModelError {
    ModelError::Invalid {
        family: ct2::FAMILY,
        reason,
    }
}
