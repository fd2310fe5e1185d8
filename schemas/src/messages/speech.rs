//! The speech-to-text family's records: an audio file to transcribe, its
//! transcript, and a long file's transcript part-way (checkpoints).

use serde::{Deserialize, Serialize};

/// Transcribe in the spoken language, or translate into English.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeechTask {
    /// Text in the language spoken.
    #[default]
    Transcribe,
    /// English text, whatever the language spoken (multilingual models).
    Translate,
}

impl SpeechTask {
    /// The name `--task` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transcribe => "transcribe",
            Self::Translate => "translate",
        }
    }
}

/// How one file is transcribed. Resolved at submit time (job defaults
/// filled in), so a redelivered shard runs exactly as before. The decoding
/// fields have defaults and are left out at their defaults, so messages of
/// older producers read the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeechOptions {
    /// The spoken language's code (`en`, `de`, …); `None`: detected from the
    /// file's first 30 seconds (multilingual models).
    pub language: Option<String>,
    /// Transcribe or translate.
    pub task: SpeechTask,
    /// Segment timestamps; without them each 30-second window is one
    /// segment.
    pub timestamps: bool,
    /// Beams at temperature 0 (1: greedy; at most
    /// [`crate::limits::MAX_SPEECH_BEAMS`]).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub beam_size: u32,
    /// Temperatures tried in turn, each in 0..=1 (at most
    /// [`crate::limits::MAX_SPEECH_TEMPERATURES`]). One: plain
    /// decoding. More: Whisper's fallback, where a window that repeats
    /// itself or is unlikely is decoded again at the next temperature, and
    /// silence is skipped.
    #[serde(default = "greedy", skip_serializing_if = "is_greedy")]
    pub temperatures: Vec<f32>,
    /// Text the file's first window is conditioned on (names, spellings,
    /// style), at most
    /// [`crate::limits::MAX_INITIAL_PROMPT_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_prompt: Option<String>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn greedy() -> Vec<f32> {
    vec![0.0]
}

fn is_greedy(t: &[f32]) -> bool {
    t == [0.0]
}

impl SpeechOptions {
    /// Why these options cannot run, if they cannot: beams, temperatures
    /// and the prompt's size within their limits.
    pub fn check(&self) -> Result<(), String> {
        use crate::limits::{MAX_SPEECH_BEAMS, MAX_SPEECH_TEMPERATURES};
        if !(1..=MAX_SPEECH_BEAMS).contains(&self.beam_size) {
            return Err(format!(
                "beam size {} is not within 1..={MAX_SPEECH_BEAMS}",
                self.beam_size
            ));
        }
        if self.temperatures.is_empty() || self.temperatures.len() > MAX_SPEECH_TEMPERATURES {
            return Err(format!(
                "{} temperatures; give 1 to {MAX_SPEECH_TEMPERATURES}",
                self.temperatures.len()
            ));
        }
        if let Some(t) = self.temperatures.iter().find(|t| !(0.0..=1.0).contains(*t)) {
            return Err(format!("temperature {t} is not within 0..=1"));
        }
        if let Some(p) = &self.initial_prompt
            && p.len() > crate::limits::MAX_INITIAL_PROMPT_BYTES
        {
            return Err(format!(
                "the initial prompt is {} bytes, over {}",
                p.len(),
                crate::limits::MAX_INITIAL_PROMPT_BYTES
            ));
        }
        Ok(())
    }
}

impl Default for SpeechOptions {
    fn default() -> Self {
        Self {
            language: None,
            task: SpeechTask::Transcribe,
            timestamps: true,
            beam_size: 1,
            temperatures: greedy(),
            initial_prompt: None,
        }
    }
}

/// One input record of a speech job: an audio file in the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AudioRecord {
    /// The file's key in the fleet's store.
    pub key: String,
    /// Its size in bytes, as submitted.
    pub bytes: u64,
    /// The file's name as the user gave it (its extension hints the format;
    /// `collect --format srt` names subtitle files after it).
    pub name: String,
    /// How to transcribe it.
    pub options: SpeechOptions,
}

/// A span of a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptSegment {
    /// Start, seconds from the file's start.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// The words (usually with a leading space, as the model writes them).
    pub text: String,
}

/// One file's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transcription {
    /// The segments' texts joined, trimmed.
    pub text: String,
    /// The spoken language's code, where the model names one.
    pub language: Option<String>,
    /// Segments with text, in order.
    pub segments: Vec<TranscriptSegment>,
    /// The audio's length, seconds.
    pub duration: f64,
    /// Why the file could not be transcribed (unreadable, over a limit,
    /// a language the model does not know); the text is then empty and the
    /// rest of the shard is unaffected.
    pub error: Option<String>,
}

impl Transcription {
    /// The audio's length in whole milliseconds (what events and the
    /// ledger count).
    pub fn audio_ms(&self) -> u64 {
        (self.duration * 1000.0).round() as u64
    }

    /// A file that could not be transcribed, and why.
    pub fn failed(reason: impl Into<String>) -> Self {
        Self {
            text: String::new(),
            language: None,
            segments: Vec::new(),
            duration: 0.0,
            error: Some(reason.into()),
        }
    }
}

/// A segment as tokens (a partial transcript's; text is made at the end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenSegment {
    /// Start, seconds.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// The tokens, timestamps included.
    pub tokens: Vec<u32>,
}

/// A long file transcribed part-way: its windows up to `seek` are done.
/// Windows are not conditioned on earlier text, so resuming here gives
/// what running on would have given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartialTranscription {
    /// Where the next window starts, in mel frames (100 per second).
    pub seek: u64,
    /// The language token in use (multilingual models).
    pub language: Option<u32>,
    /// Windows decoded so far.
    pub windows: u32,
    /// Segments so far.
    pub segments: Vec<TokenSegment>,
}
