//! The speech-to-text family (Whisper, from CTranslate2's model folders):
//! - `audio` — decoding an audio file to 16 kHz mono samples, with limits;
//! - `mel` — Whisper's log-mel front end;
//! - `ct2` — reading CTranslate2's `model.bin` into named tensors;
//! - `whisper` — the encoder and the decoder with its caches;
//! - `decode` — greedy decoding, beam search and sampling with Whisper's
//!   token rules;
//! - `transcribe` — files window by window, batched, with the fallback.

pub mod audio;
pub mod canary;
pub mod ct2;
pub mod decode;
mod host_attention;
pub mod mel;
pub mod transcribe;
pub mod whisper;

use std::path::Path;

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::Device;
use minions_schemas::messages::{
    PartialTranscription, SpeechOptions, SpeechTask, TokenSegment, TranscriptSegment, Transcription,
};
use tokenizers::Tokenizer;

use crate::{EnginePath, ModelError};
use decode::Specials;
use mel::MelFrontEnd;
use transcribe::{Event, Partial, TranscribeOptions, Transcript};
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
    /// The spoken language's code (`en`, …): the one the model detected or
    /// was given; `en` for an English-only model.
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
    /// Bytes the weights take loaded (as f32).
    weight_bytes: u64,
    mel: MelFrontEnd,
    specials: Specials,
    tokenizer: Tokenizer,
}

impl SpeechModel {
    /// Loads `dir` (`model.bin`, `config.json`, `vocabulary.txt`,
    /// `tokenizer.json`) onto `device`, to run the code `path` names.
    pub fn load(dir: &Path, device: &Device, path: EnginePath) -> Result<Self, ModelError> {
        let f = ct2::Ct2File::open(&dir.join("model.bin"))?;
        let weight_bytes = f
            .names()
            .filter_map(|n| f.var(n))
            .map(|v| v.dims.iter().product::<usize>() as u64 * 4)
            .sum();
        let whisper = Whisper::from_file(&f, device, path.host_kernels(device))?;
        drop(f);
        let specials = Specials::load(dir, whisper.dims().vocab)?;
        let tokenizer = load_tokenizer(dir)?;
        let mel = MelFrontEnd::new(whisper.dims().n_mels)
            .map_err(|e| ct2_invalid(format!("model.bin: {e}")))?;
        Ok(Self {
            whisper,
            weight_bytes,
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
            self.parts(&|t| self.text(t).unwrap_or_default()),
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
            // An English-only model names no language token: it writes
            // English.
            language: match t.language {
                Some(l) => self.specials.language_code(l).map(str::to_string),
                None if !self.specials.multilingual() => Some("en".to_string()),
                None => None,
            },
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

/// One audio file for [`crate::Model::transcribe`].
#[derive(Clone, Debug)]
pub struct SpeechFile<'a> {
    /// 16 kHz mono samples.
    pub samples: &'a [f32],
    /// How to transcribe it.
    pub options: &'a SpeechOptions,
    /// Where an earlier run left it (windows done), if anywhere.
    pub resume: Option<PartialTranscription>,
}

/// What [`crate::Model::transcribe`] reports about one file.
#[derive(Clone, Debug, PartialEq)]
pub enum SpeechEvent {
    /// A window is done and the file goes on: where it stands now.
    Window(PartialTranscription),
    /// The file is done.
    Done(Transcription),
}

/// Windows per encoder batch when transcribing a shard's files.
pub const SHARD_BATCH: usize = 8;

impl crate::Model for SpeechModel {
    fn family(&self) -> minions_schemas::messages::ModelFamily {
        minions_schemas::messages::ModelFamily::WhisperSpeech
    }

    /// The weights, and what a shard's batch of windows holds besides:
    /// [`SHARD_BATCH`] windows' mel and encoder states, and the decoder's
    /// caches (cross and self attention, every layer, f32).
    fn memory_bytes(&self) -> u64 {
        let d = self.whisper.dims();
        let (width, layers) = (d.d_model as u64, d.decoder_layers as u64);
        let batch = SHARD_BATCH as u64;
        let mel = batch * d.n_mels as u64 * transcribe::WINDOW_FRAMES as u64 * 4;
        let encoded = batch * d.audio_ctx as u64 * width * 4;
        let caches = batch * layers * 2 * (d.audio_ctx + d.text_ctx) as u64 * width * 4;
        self.weight_bytes + mel + encoded + caches
    }

    fn transcribe(
        &self,
        files: &[SpeechFile<'_>],
        stop: &AtomicBool,
        events: &mut dyn FnMut(usize, SpeechEvent),
    ) -> Result<(), ModelError> {
        // Files asking for the same options run together.
        let mut groups: Vec<(&SpeechOptions, Vec<usize>)> = Vec::new();
        for (i, f) in files.iter().enumerate() {
            match groups.iter_mut().find(|(o, _)| *o == f.options) {
                Some((_, members)) => members.push(i),
                None => groups.push((f.options, vec![i])),
            }
        }
        for (options, members) in groups {
            let opts = match self.options(options) {
                Ok(o) => o,
                Err(why) => {
                    for &i in &members {
                        events(i, SpeechEvent::Done(Transcription::failed(why.clone())));
                    }
                    continue;
                }
            };
            let samples: Vec<&[f32]> = members.iter().map(|&i| files[i].samples).collect();
            let starts: Vec<Partial> = members
                .iter()
                .map(|&i| files[i].resume.clone().map(partial_in).unwrap_or_default())
                .collect();
            let mut failed: Option<ModelError> = None;
            let text = |t: &[u32]| self.text(t).unwrap_or_default();
            transcribe::transcribe_from(
                self.parts(&text),
                &samples,
                starts,
                &opts,
                &|| stop.load(Ordering::Relaxed),
                &mut |k, e| {
                    let i = members[k];
                    match e {
                        Event::Window(p) => events(i, SpeechEvent::Window(partial_out(p))),
                        Event::Done(t) => {
                            let duration = files[i].samples.len() as f64 / mel::SAMPLE_RATE as f64;
                            match self.to_text(t) {
                                Ok(t) => events(i, SpeechEvent::Done(transcription(t, duration))),
                                Err(e) => {
                                    failed.get_or_insert(e);
                                }
                            }
                        }
                    }
                },
            )?;
            if let Some(e) = failed {
                return Err(e);
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        Ok(())
    }
}

impl SpeechModel {
    /// The parts a transcription uses, with `text` for tokens to text.
    fn parts<'a>(&'a self, text: &'a dyn Fn(&[u32]) -> String) -> transcribe::Parts<'a> {
        transcribe::Parts {
            model: &self.whisper,
            specials: &self.specials,
            mel: &self.mel,
            text,
        }
    }

    /// The tokens of an initial prompt, as Whisper makes them: the text,
    /// trimmed, after one space; or why the model cannot take one.
    pub fn prompt_tokens(&self, text: &str) -> Result<Vec<u32>, String> {
        if self.specials.start_of_prev.is_none() {
            return Err("--initial-prompt: this model's vocabulary has no <|startofprev|>".into());
        }
        Ok(self
            .tokenizer
            .encode(format!(" {}", text.trim()), false)
            .map_err(|e| format!("--initial-prompt cannot be tokenized: {e}"))?
            .get_ids()
            .to_vec())
    }

    /// The engine's options for a record's, or why the model cannot follow
    /// them.
    fn options(&self, o: &SpeechOptions) -> Result<TranscribeOptions, String> {
        o.check()?;
        let sp = &self.specials;
        let language = match o.language.as_deref() {
            None => None,
            Some(code) if sp.multilingual() => Some(
                sp.language(code)
                    .ok_or_else(|| format!("language {code:?} is not one this model knows"))?,
            ),
            Some("en") => None,
            Some(code) => {
                return Err(format!("language {code:?}: this model knows English only"));
            }
        };
        if o.task == SpeechTask::Translate && !sp.multilingual() {
            return Err(
                "--task translate needs a multilingual model; this one knows English only".into(),
            );
        }
        let prompt = match o.initial_prompt.as_deref().map(str::trim) {
            None | Some("") => Vec::new(),
            Some(text) => self.prompt_tokens(text)?,
        };
        Ok(TranscribeOptions {
            language,
            translate: o.task == SpeechTask::Translate,
            timestamps: o.timestamps,
            batch: SHARD_BATCH,
            beam: o.beam_size as usize,
            temperatures: o.temperatures.clone(),
            prompt,
        })
    }
}

/// A transcript in the wire's form.
fn transcription(t: TextTranscript, duration: f64) -> Transcription {
    Transcription {
        text: t.text,
        language: t.language,
        segments: t
            .segments
            .into_iter()
            .map(|s| TranscriptSegment {
                start: s.start,
                end: s.end,
                text: s.text,
            })
            .collect(),
        duration,
        error: None,
    }
}

fn partial_out(p: &Partial) -> PartialTranscription {
    PartialTranscription {
        seek: p.seek as u64,
        language: p.language,
        windows: p.windows as u32,
        segments: p
            .segments
            .iter()
            .map(|s| TokenSegment {
                start: s.start,
                end: s.end,
                tokens: s.tokens.clone(),
            })
            .collect(),
    }
}

fn partial_in(p: PartialTranscription) -> Partial {
    Partial {
        seek: usize::try_from(p.seek).unwrap_or(usize::MAX),
        language: p.language,
        windows: p.windows as usize,
        segments: p
            .segments
            .into_iter()
            .map(|s| transcribe::Segment {
                start: s.start,
                end: s.end,
                tokens: s.tokens,
            })
            .collect(),
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
