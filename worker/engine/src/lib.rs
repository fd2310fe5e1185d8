//! The Minions inference engine: the [`Model`] trait the worker's queue code
//! runs, the model families that implement it, their tokenizers and our CPU
//! kernels. It knows nothing of NATS or object storage, so it builds, tests
//! and benchmarks alone; the worker fetches a model folder and hands it to
//! [`load`].
//!
//! A new family (images, generation, speech) adds a file here, a variant to
//! [`minions_schemas::messages::ModelFamily`] and an arm in [`load`]; the
//! pull loop and settlement code do not change.
//!
//! Layout:
//! - `bert`, `encoder` — the sentence-embedding family (BERT, mean pooled).
//! - [`llm`] — the LLM generation family (GGUF, llama architecture).
//! - [`speech`] — the speech-to-text family (Whisper).
//! - `kernels` — our CPU kernels behind candle's custom-op interface.
//! - [`device`](select_device) — which candle device a worker runs on.
//! - [`EnginePath`] — our CPU kernels, or the code a GPU runs, on the CPU.
//! - [`tiny`] — tiny random-weight models for tests.
//! - [`canary`] — the known shard a worker runs before it pulls work.

mod bert;
mod bert_config;
pub mod canary;
mod device;
mod encoder;
mod engine_path;
mod error;
mod kernels;
pub mod llm;
pub mod speech;
pub mod tiny;

use std::path::Path;
use std::sync::Arc;

use minions_schemas::messages::{Generation, GenerationRecord, ModelFamily, OutputPayload};

pub use bert::BertEmbedder;
pub use bert_config::BertConfig;
pub use device::{DeviceChoice, describe_device, select_device};
pub use engine_path::{ENGINE_PATH_ENV, EnginePath};
pub use error::ModelError;
pub use kernels::{
    CPU_PATH_ENV, CpuPath, KERNEL_FAULT_ENV, Peak, PeakRate, kernel_fault, measure_peak,
};
pub use minions_schemas::messages::Precision;

/// How a shard's texts are cut into forward passes: sorted by length, then
/// taken in order while a pass holds at most `max_texts` texts and, padded
/// to its longest, at most `max_tokens` tokens (a single text always fits).
/// Short texts then go in large passes and long ones in small passes, so
/// every pass does about the same work and memory stays bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    /// Texts per pass, at least 1.
    pub max_texts: usize,
    /// Tokens per pass, padding included.
    pub max_tokens: usize,
}

impl Batching {
    /// Tokens per pass when not set: large enough that a pass of short
    /// texts keeps the products' tiles full, small enough that its
    /// activations stay in tens of megabytes.
    pub const DEFAULT_TOKENS: usize = 8192;
    /// Texts per pass when not set; the token budget binds first unless
    /// texts average under 64 tokens.
    pub const DEFAULT_TEXTS: usize = 128;

    /// At most `max_texts` texts per pass and the default token budget.
    pub fn texts(max_texts: usize) -> Self {
        Self {
            max_texts,
            max_tokens: Self::DEFAULT_TOKENS,
        }
    }

    /// The passes over texts of `lens` tokens, sorted longest first: each
    /// a range of that order, together covering it.
    pub fn passes(&self, lens: &[usize]) -> Vec<std::ops::Range<usize>> {
        let mut out = Vec::new();
        let mut start = 0;
        while start < lens.len() {
            // Sorted longest first: the pass pads to its first text.
            let longest = lens[start].max(1);
            let fit = (self.max_tokens / longest).clamp(1, self.max_texts.max(1));
            let end = (start + fit).min(lens.len());
            out.push(start..end);
            start = end;
        }
        out
    }
}

/// A loaded model that turns a shard's texts into its output.
///
/// Implementations must be deterministic for the same inputs on the same
/// device (so a redelivered shard writes the same bytes), must return rows in
/// input order, and must not depend on how the texts are batched beyond
/// floating-point rounding.
pub trait Model: Send + Sync {
    /// The family this model belongs to.
    fn family(&self) -> ModelFamily;

    /// Runs the model over `texts`, in forward passes cut as `batching`
    /// says. Blocking and compute-heavy: call it off the async runtime.
    /// Families that do not embed refuse.
    fn run(&self, texts: &[String], batching: Batching) -> Result<OutputPayload, ModelError> {
        let _ = (texts, batching);
        Err(ModelError::BadInput(format!(
            "a {} model does not embed texts",
            self.family()
        )))
    }

    /// Generates for `records` (each with its index in the shard), handing
    /// each result to `done` as soon as it is finished, in any order; stops
    /// early when `control.stop` is set. A record that cannot run gets an
    /// error result; the others are unaffected. Blocking and compute-heavy.
    /// A record's result depends on that record alone. Families that do not
    /// generate refuse.
    fn generate(
        &self,
        records: &[(usize, &GenerationRecord)],
        limits: llm::GenLimits,
        control: &llm::GenControl,
        done: &mut dyn FnMut(usize, Generation),
    ) -> Result<(), ModelError> {
        let _ = (records, limits, control, done);
        Err(ModelError::BadInput(format!(
            "a {} model does not generate text",
            self.family()
        )))
    }

    /// Whether [`Model::generate_joined`] takes in records while it runs
    /// (continuous batching across shards).
    fn joins(&self) -> bool {
        false
    }

    /// [`Model::generate`], also taking in the records that `joining`
    /// brings while the run goes on (their indices unique within the run)
    /// and dropping those it no longer wants. Models that do not
    /// [`Model::joins`] run `records` alone.
    fn generate_joined(
        &self,
        records: &[(usize, &GenerationRecord)],
        limits: llm::GenLimits,
        control: &llm::GenControl,
        joining: &mut dyn llm::Joining,
        done: &mut dyn FnMut(usize, Generation),
    ) -> Result<(), ModelError> {
        let _ = joining;
        self.generate(records, limits, control, done)
    }

    /// Transcribes audio `files`, each from its resume point, reporting
    /// every window of an unfinished file and every finished file to
    /// `events` with the file's index; stops between windows once `stop`
    /// is set. A file that cannot run (a language the model does not know)
    /// gets a failed result; the others are unaffected. Blocking and
    /// compute-heavy. Families that do not transcribe refuse.
    fn transcribe(
        &self,
        files: &[speech::SpeechFile<'_>],
        stop: &std::sync::atomic::AtomicBool,
        events: &mut dyn FnMut(usize, speech::SpeechEvent),
    ) -> Result<(), ModelError> {
        let _ = (files, stop, events);
        Err(ModelError::BadInput(format!(
            "a {} model does not transcribe audio",
            self.family()
        )))
    }

    /// Bytes the loaded weights take (0 when not known).
    fn memory_bytes(&self) -> u64 {
        0
    }
}

/// Loads a verified model folder of `family` onto `device` in `precision`,
/// to run the code `path` names.
pub fn load(
    family: ModelFamily,
    dir: &Path,
    device: &candle_core::Device,
    precision: Precision,
    path: EnginePath,
) -> Result<Arc<dyn Model>, ModelError> {
    match family {
        ModelFamily::BertEmbedding => Ok(Arc::new(BertEmbedder::load_with(
            dir, device, precision, path,
        )?)),
        // Quantized GGUF weights run in the file's own formats.
        ModelFamily::LlmGeneration => {
            Ok(Arc::new(llm::GgufGenerator::load_with(dir, device, path)?))
        }
        // Speech models run in f32 whatever the job asks.
        ModelFamily::WhisperSpeech => Ok(Arc::new(speech::SpeechModel::load(dir, device, path)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::Batching;

    #[test]
    fn passes_keep_to_both_limits_and_cover_every_text() {
        let b = Batching {
            max_texts: 4,
            max_tokens: 100,
        };
        let lens = [60, 40, 30, 30, 20, 10, 10, 10, 10, 10, 3];
        let passes = b.passes(&lens);
        // 60 alone fits once; 40 pads to 80 for two; then 30s by three; ...
        assert_eq!(passes, vec![0..1, 1..3, 3..6, 6..10, 10..11]);
        for p in &passes {
            assert!(p.len() <= b.max_texts);
            assert!(p.len() == 1 || p.len() * lens[p.start] <= b.max_tokens);
        }
    }

    #[test]
    fn a_text_over_the_budget_still_runs_alone() {
        let b = Batching::texts(8);
        let lens = [Batching::DEFAULT_TOKENS * 2, 0, 0];
        assert_eq!(b.passes(&lens), vec![0..1, 1..3]);
        assert!(Batching::texts(0).passes(&[]).is_empty());
    }
}
