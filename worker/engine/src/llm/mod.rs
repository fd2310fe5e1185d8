//! The LLM generation family: a language model in one GGUF file, run over
//! a shard's prompts with continuous batching.
//!
//! Layout:
//! - [`gguf`] — the file: metadata, hyper-parameters, tensors, clear errors.
//! - [`tokenizer`] — the file's tokenizer, split as llama.cpp splits.
//! - [`chat`] — the file's chat template, rendered with minijinja.
//! - [`llama`] — the transformer over quantized weights, many sequences a pass.
//! - [`sampler`] — greedy or seeded sampling per sequence.
//! - [`generate`] — continuous batching under a KV-memory budget.
//! - [`pipeline`] — the same, driven by the first stage of a split model,
//!   with micro-batch groups in flight through the later stages at once.
//! - [`stage`] — a later stage: its layers, its caches, what it refuses.
//! - [`stage_wire`] — passes and replies cut into parts and put together.

mod attention;
pub mod chat;
pub mod generate;
pub mod gguf;
pub mod gguf_slice;
pub mod llama;
pub mod pace;
pub mod pipeline;
pub mod sampler;
pub mod stage;
pub mod stage_wire;
pub mod tokenizer;

use std::path::{Path, PathBuf};

use candle_core::Device;
use minions_schemas::messages::{Generation, GenerationRecord, ModelFamily, Prompt};

pub use chat::{ChatMessage, ChatTemplate};
pub use generate::{Feed, GenControl, GenLimits, NoFeed, Prepared};
pub use gguf::{GgufFile, GgufPieces, LlamaConfig};
pub use llama::Llama;
pub use tokenizer::GgufTokenizer;

use crate::{EnginePath, Model, ModelError};

/// A loaded GGUF language model: weights, tokenizer and chat template.
pub struct GgufGenerator {
    model: Llama,
    tokenizer: GgufTokenizer,
    template: Option<ChatTemplate>,
    weight_bytes: u64,
}

/// The one `.gguf` file in `dir` (or `dir` itself when it is a file).
pub fn find_gguf(dir: &Path) -> Result<PathBuf, ModelError> {
    if dir.is_file() {
        return Ok(dir.to_owned());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| ModelError::Cache {
        path: dir.display().to_string(),
        source: e,
    })?;
    let mut found = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        if p.extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        {
            found.push(p);
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(ModelError::Invalid {
            family: "llm-generation",
            reason: format!(
                "{} holds {n} .gguf files; a generation model is exactly one",
                dir.display()
            ),
        }),
    }
}

impl GgufGenerator {
    /// Loads the GGUF file in `dir` (or the file `dir`) onto `device`, on
    /// the fast path ([`EnginePath::Fast`]).
    pub fn load(dir: &Path, device: &Device) -> Result<Self, ModelError> {
        Self::load_with(dir, device, EnginePath::Fast)
    }

    /// [`GgufGenerator::load`], to run the code `path` names.
    pub fn load_with(
        dir: &Path,
        device: &Device,
        engine_path: EnginePath,
    ) -> Result<Self, ModelError> {
        Self::load_part(
            &GgufPieces::whole(find_gguf(dir)?),
            device,
            engine_path,
            None,
        )
    }

    /// Loads the tokenizer and one stage of the model in `dir`: the layers
    /// `range` ([`Llama::load_stage`]), for a group that splits it.
    pub fn load_stage(
        dir: &Path,
        device: &Device,
        engine_path: EnginePath,
        range: std::ops::Range<usize>,
    ) -> Result<Self, ModelError> {
        Self::load_stage_pieces(
            &GgufPieces::whole(find_gguf(dir)?),
            device,
            engine_path,
            range,
        )
    }

    /// As [`GgufGenerator::load_stage`], from `pieces`: the whole file or
    /// a stage's slice of it that holds what `range` reads.
    pub fn load_stage_pieces(
        pieces: &GgufPieces,
        device: &Device,
        engine_path: EnginePath,
        range: std::ops::Range<usize>,
    ) -> Result<Self, ModelError> {
        Self::load_part(pieces, device, engine_path, Some(range))
    }

    fn load_part(
        pieces: &GgufPieces,
        device: &Device,
        engine_path: EnginePath,
        range: Option<std::ops::Range<usize>>,
    ) -> Result<Self, ModelError> {
        let path = &pieces.path;
        let mut file = GgufFile::open_pieces(pieces)?;
        let tokenizer = GgufTokenizer::from_gguf(&file)?;
        let template = match file.metadata().get("tokenizer.chat_template") {
            Some(_) => Some(ChatTemplate::new(
                file.string("tokenizer.chat_template")?,
                tokenizer.bos_text(),
                tokenizer.eos_text(),
            )?),
            None => None,
        };
        let all_bytes = file.tensor_bytes();
        let model = match range {
            Some(r) => Llama::load_stage(&mut file, device, engine_path, r)?,
            None => Llama::load(&mut file, device, engine_path)?,
        };
        // A stage holds about its share of the layers' weights.
        let weight_bytes = match model.layers() {
            r if r.len() == model.config().layers => all_bytes,
            r => all_bytes * r.len() as u64 / model.config().layers.max(1) as u64,
        };
        if tokenizer.vocab_size() != model.config().vocab {
            return Err(ModelError::Invalid {
                family: "llm-generation",
                reason: format!(
                    "{}: tokenizer has {} tokens, the model {}",
                    path.display(),
                    tokenizer.vocab_size(),
                    model.config().vocab
                ),
            });
        }
        Ok(Self {
            model,
            tokenizer,
            template,
            weight_bytes,
        })
    }

    /// The transformer.
    pub fn model(&self) -> &Llama {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &GgufTokenizer {
        &self.tokenizer
    }

    /// Bytes the weights take in the file.
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// The prompt text `record` asks for: raw, or its messages rendered with
    /// the model's chat template.
    pub fn prompt_text(&self, record: &GenerationRecord) -> Result<String, ModelError> {
        match &record.prompt {
            Prompt::Text(t) => Ok(t.clone()),
            Prompt::Messages(turns) => {
                let Some(t) = &self.template else {
                    return Err(ModelError::BadInput(
                        "the model has no chat template (tokenizer.chat_template); send a raw prompt".into(),
                    ));
                };
                let messages: Vec<ChatMessage> = turns
                    .iter()
                    .map(|m| ChatMessage {
                        role: m.role.clone(),
                        content: m.content.clone(),
                    })
                    .collect();
                t.render(&messages)
            }
        }
    }

    /// Tokenizes `record` (record `index` of its shard) and checks that its
    /// prompt and `max_tokens` fit the model's context.
    pub fn prepare(&self, index: usize, record: &GenerationRecord) -> Result<Prepared, ModelError> {
        let text = self.prompt_text(record)?;
        let prompt = self.tokenizer.encode(&text, true)?;
        if prompt.is_empty() {
            return Err(ModelError::BadInput("the prompt is empty".into()));
        }
        let context = self.model.config().context;
        let want = prompt.len() + record.params.max_tokens as usize;
        if want > context {
            return Err(ModelError::BadInput(format!(
                "prompt of {} tokens plus max_tokens {} exceeds the model's context of {context}",
                prompt.len(),
                record.params.max_tokens
            )));
        }
        Ok(Prepared {
            index,
            prompt,
            params: record.params.clone(),
        })
    }
}

impl GgufGenerator {
    /// [`GgufGenerator::prepare`] for each of `records`; a record that
    /// cannot run goes to `done` with its error, the others are returned.
    pub fn prepare_all(
        &self,
        records: &[(usize, &GenerationRecord)],
        done: &mut dyn FnMut(usize, Generation),
    ) -> Result<Vec<Prepared>, ModelError> {
        let mut work = Vec::with_capacity(records.len());
        for (index, record) in records {
            match self.prepare(*index, record) {
                Ok(p) => work.push(p),
                Err(ModelError::BadInput(m)) => done(*index, Generation::failed(m)),
                Err(e) => return Err(e),
            }
        }
        Ok(work)
    }
}

impl Model for GgufGenerator {
    fn family(&self) -> ModelFamily {
        ModelFamily::LlmGeneration
    }

    fn generate(
        &self,
        records: &[(usize, &GenerationRecord)],
        limits: GenLimits,
        control: &GenControl,
        done: &mut dyn FnMut(usize, Generation),
    ) -> Result<(), ModelError> {
        let work = self.prepare_all(records, done)?;
        generate::generate(&self.model, &self.tokenizer, work, limits, control, done)
    }

    fn joins(&self) -> bool {
        true
    }

    fn generate_joined(
        &self,
        records: &[(usize, &GenerationRecord)],
        limits: GenLimits,
        control: &GenControl,
        joining: &mut dyn Joining,
        done: &mut dyn FnMut(usize, Generation),
    ) -> Result<(), ModelError> {
        let work = self.prepare_all(records, done)?;
        let mut feed = Preparing {
            generator: self,
            joining,
        };
        generate::generate_fed(
            &self.model,
            &self.tokenizer,
            work,
            limits,
            control,
            &mut feed,
            done,
        )
    }

    fn memory_bytes(&self) -> u64 {
        self.weight_bytes
    }
}

/// Records of other shards that join a running generation, as the worker
/// hands them over: see [`Model::generate_joined`].
pub trait Joining: Send {
    /// Records that join now, each with its index within the run.
    fn take(&mut self) -> Vec<(usize, GenerationRecord)>;
    /// Whether a shard may have left since the last call (asked before
    /// every pass; [`Joining::wanted`] is asked of each record only then).
    fn departed(&mut self) -> bool;
    /// Whether record `index` still wants its result (its shard has not
    /// left the run).
    fn wanted(&self, index: usize) -> bool;
    /// Called when nothing is left to run: the records that join now, or
    /// none to end the run; once it returns none it takes no more.
    fn wait(&mut self) -> Vec<(usize, GenerationRecord)>;
    /// Called before each pass with the sequences running and the records
    /// waiting for room.
    fn settled(&mut self, running: usize, waiting: usize);
}

/// A [`Joining`] seen as the batching loop's [`Feed`]: tokenizes what joins.
struct Preparing<'a> {
    generator: &'a GgufGenerator,
    joining: &'a mut dyn Joining,
}

impl Preparing<'_> {
    fn prepared(
        &self,
        got: Vec<(usize, GenerationRecord)>,
    ) -> Vec<Result<Prepared, (usize, String)>> {
        got.into_iter()
            .map(
                |(index, record)| match self.generator.prepare(index, &record) {
                    Ok(p) => Ok(p),
                    // As `prepare_all` reports it for a shard's own records.
                    Err(ModelError::BadInput(m)) => Err((index, m)),
                    Err(e) => Err((index, e.to_string())),
                },
            )
            .collect()
    }
}

impl Feed for Preparing<'_> {
    fn take(&mut self) -> Vec<Result<Prepared, (usize, String)>> {
        let got = self.joining.take();
        self.prepared(got)
    }
    fn departed(&mut self) -> bool {
        self.joining.departed()
    }
    fn wanted(&self, index: usize) -> bool {
        self.joining.wanted(index)
    }
    fn wait(&mut self) -> Vec<Result<Prepared, (usize, String)>> {
        let got = self.joining.wait();
        self.prepared(got)
    }
    fn settled(&mut self, running: usize, waiting: usize) {
        self.joining.settled(running, waiting);
    }
}

/// What `model push` learns of a GGUF file without loading its weights.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufSummary {
    /// `general.architecture`.
    pub arch: String,
    /// The model's context length in tokens.
    pub context: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Transformer layers.
    pub layers: usize,
    /// Bytes of weights.
    pub weight_bytes: u64,
    /// Whether the file carries a chat template (`messages` records need one).
    pub chat_template: bool,
}

/// Checks that `path` is a GGUF file this engine runs (readable, complete,
/// a supported architecture and tokenizer, a chat template that compiles)
/// without loading its weights.
pub fn inspect(path: &Path) -> Result<GgufSummary, ModelError> {
    let file = GgufFile::open(path)?;
    let cfg = LlamaConfig::from_gguf(&file)?;
    let tokenizer = GgufTokenizer::from_gguf(&file)?;
    let chat_template = match file.metadata().get("tokenizer.chat_template") {
        Some(_) => {
            ChatTemplate::new(
                file.string("tokenizer.chat_template")?,
                tokenizer.bos_text(),
                tokenizer.eos_text(),
            )?;
            true
        }
        None => false,
    };
    Ok(GgufSummary {
        arch: cfg.arch,
        context: cfg.context,
        vocab: cfg.vocab,
        layers: cfg.layers,
        weight_bytes: file.tensor_bytes(),
        chat_template,
    })
}
