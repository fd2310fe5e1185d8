use serde::{Deserialize, Serialize};

/// One chat message of a generation record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatTurn {
    /// `system`, `user`, `assistant`, `tool` or `developer`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// What a generation record asks the model to continue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Prompt {
    /// Raw text, tokenized as is (control tokens written in it count).
    Text(String),
    /// Chat messages, rendered with the model's own chat template.
    Messages(Vec<ChatTurn>),
}

/// How one record is sampled. Every field is resolved at submit time (job
/// defaults filled in), so a redelivered shard samples exactly as before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// 0 = greedy (the most likely token each step).
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this mass (1 = off).
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = off).
    pub top_k: u32,
    /// The record's own random seed: its output does not depend on which
    /// other records share its batch or its worker.
    pub seed: u64,
    /// Generation ends before the first of these strings; it is not output.
    pub stop: Vec<String>,
}

impl SamplingParams {
    /// Most tokens per record when neither the record nor the job says.
    pub const DEFAULT_MAX_TOKENS: u32 = 256;
    /// Most stop strings per record.
    pub const MAX_STOP: usize = 16;
}

/// One input record of a generation job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationRecord {
    /// What to continue.
    pub prompt: Prompt,
    /// How to sample.
    pub params: SamplingParams,
}

/// Why a record's generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended its answer, or a stop string was reached.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The record could not run (see [`Generation::error`]); the rest of the
    /// shard is unaffected.
    Error,
}

impl FinishReason {
    /// The name output files use (OpenAI's, for `stop` and `length`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Error => "error",
        }
    }
}

/// One record's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// The generated text (stop strings and end tokens excluded).
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Tokens in the prompt as the model read it.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Why the record could not run, when `finish_reason` is `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Generation {
    /// A record that could not run.
    pub fn failed(reason: impl Into<String>) -> Self {
        Self {
            text: String::new(),
            finish_reason: FinishReason::Error,
            prompt_tokens: 0,
            completion_tokens: 0,
            error: Some(reason.into()),
        }
    }
}
