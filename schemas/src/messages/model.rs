use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ids::{ModelHash, ModelName};

/// What kind of model a folder holds; decides how a worker runs it and what
/// shape its output has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelFamily {
    /// BERT sentence embeddings, mean pooling, L2 normalised
    /// (sentence-transformers' all-MiniLM-L6-v2 layout).
    BertEmbedding,
    /// A language model in one GGUF file (llama architecture), generating
    /// text for prompts or chat messages.
    LlmGeneration,
    /// Whisper speech to text, in CTranslate2's folder format (`model.bin`,
    /// `config.json`, `tokenizer.json`, `vocabulary.txt`). Workers do not
    /// take its jobs yet; `model push` checks and stores it.
    WhisperSpeech,
}

impl ModelFamily {
    /// The family's name as users type it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BertEmbedding => "bert-embedding",
            Self::LlmGeneration => "llm-generation",
            Self::WhisperSpeech => "whisper-speech",
        }
    }

    /// Every family, for detection and help texts.
    pub const ALL: [ModelFamily; 3] = [
        Self::BertEmbedding,
        Self::LlmGeneration,
        Self::WhisperSpeech,
    ];

    /// The files a model folder of this family must hold by name (a
    /// generation model instead holds exactly one `.gguf` file).
    pub fn required_files(self) -> &'static [&'static str] {
        match self {
            Self::BertEmbedding => &["config.json", "tokenizer.json", "model.safetensors"],
            Self::LlmGeneration => &[],
            Self::WhisperSpeech => &[
                "model.bin",
                "config.json",
                "tokenizer.json",
                "vocabulary.txt",
            ],
        }
    }

    /// Whether this family generates text (its records are prompts, its
    /// outputs generations) rather than embedding texts.
    pub fn generates(self) -> bool {
        matches!(self, Self::LlmGeneration)
    }
}

impl std::fmt::Display for ModelFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The number format a worker runs a model's large matrix products in.
///
/// A job's choice: every shard of a job runs in the same precision, so its
/// outputs are comparable. Norms, softmax, embeddings and pooling stay f32
/// in every precision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// f32 throughout: the checkpoint's own numbers.
    #[default]
    F32,
    /// Linear-layer weights as 8-bit integers, activations quantised per
    /// product: on a CPU with our kernel one scale per weight row and per
    /// token, elsewhere (GPUs, the device path) blocks of 32 with one scale
    /// each (ggml's Q8_0). Faster on CPUs; vectors close to, not equal to,
    /// f32's.
    Int8,
    /// Linear layers' products in IEEE half precision (weights stored in
    /// f16, activations rounded to f16 for each product), as GPUs run these
    /// models. A CPU with our kernels has no faster f16 product and runs
    /// it as f32, so its vectors are f32's; the device path runs f16 on the
    /// CPU too. Vectors within a cosine of 0.9995 of f32's.
    F16,
    /// As [`Self::F16`] in bfloat16 (f32's range, 8 bits of mantissa),
    /// which recent GPUs (CUDA, Metal) run natively. A CPU with our kernels
    /// runs it as f32. Vectors within a cosine of 0.999 of f32's.
    Bf16,
}

impl Precision {
    /// The name as users type it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Int8 => "int8",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }

    /// The least cosine two runs of one embedding at this precision reach
    /// on any device and kernel path: CPU kernel paths agree bit for bit,
    /// but Metal, CUDA and CPU sum in different orders, and int8 quantises
    /// activations per product. A faulty machine falls far below.
    pub fn min_cosine(self) -> f64 {
        match self {
            Self::F32 => 0.9999,
            Self::Int8 => 0.999,
            Self::F16 => 0.9995,
            Self::Bf16 => 0.999,
        }
    }

    /// The least cosine two runs of one embedding at this precision reach
    /// when made with different arithmetic
    /// ([`super::Provenance::same_arithmetic`]): f32 as [`Self::min_cosine`];
    /// int8 lower, as GPUs quantise in blocks of 32 (ggml's Q8_0) and our CPU
    /// kernel with one scale per row: all-MiniLM-L6-v2's rows of 1 to 256
    /// tokens came out of the two at a least cosine of 0.988 (each within
    /// 0.989 of f32). A single component of a unit vector off by 0.25, as
    /// faulty memory gives, is still below: about 0.97.
    pub fn min_cosine_across(self) -> f64 {
        match self {
            Self::F32 => 0.9999,
            Self::Int8 => 0.98,
            Self::F16 => 0.9995,
            Self::Bf16 => 0.999,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One file of a model folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFile {
    /// File name (one path segment, see [`crate::keys::valid_model_file_name`]).
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256 of the content, hex.
    pub sha256: String,
    /// SHA-256 (hex) of each [`MODEL_CHUNK_BYTES`] piece of the file in
    /// order, the last one shorter where the size is not a multiple; set
    /// for GGUF files, so a group's stage fetches and checks only the
    /// pieces that hold its layers. Empty: the file is fetched whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<String>,
}

/// The piece of a model file each [`ModelFile::chunks`] hash covers.
pub const MODEL_CHUNK_BYTES: u64 = 16 << 20;

impl ModelFile {
    /// Pieces a file of `bytes` is cut into for [`ModelFile::chunks`].
    pub fn chunk_count(bytes: u64) -> u64 {
        bytes.div_ceil(MODEL_CHUNK_BYTES)
    }

    /// Whether `chunks` holds one hash per piece of the file (or none).
    pub fn chunks_agree(&self) -> bool {
        self.chunks.is_empty() || self.chunks.len() as u64 == Self::chunk_count(self.bytes)
    }
}

/// A model's content: its family and files. The model's hash is the SHA-256
/// of this manifest's encoding, so equal folders get equal hashes and any
/// changed byte changes the hash. Limit: [`crate::limits::MAX_MANIFEST_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelManifest {
    /// Schema version.
    pub v: u16,
    /// The family.
    pub family: ModelFamily,
    /// The files, sorted by name.
    pub files: Vec<ModelFile>,
}

impl ModelManifest {
    /// The content hash: SHA-256 of the canonical encoding (files sorted).
    pub fn content_hash(&self) -> Result<ModelHash, crate::CodecError> {
        let mut canonical = self.clone();
        canonical.files.sort_by(|a, b| a.name.cmp(&b.name));
        let bytes = crate::encode("model manifest", &canonical)?;
        let digest = Sha256::digest(&bytes);
        // 64 lowercase hex digits by construction.
        ModelHash::new(hex::encode(digest)).map_err(|e| crate::CodecError::Encode {
            what: "model hash",
            source: rmp_serde::encode::Error::Syntax(e.to_string()),
        })
    }

    /// Total size of the files in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// A model name record: points a mutable name at immutable content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRecord {
    /// Schema version.
    pub v: u16,
    /// The name.
    pub name: ModelName,
    /// The content it points at.
    pub hash: ModelHash,
    /// The model's family.
    pub family: ModelFamily,
    /// Total file size in bytes.
    pub bytes: u64,
    /// When it was pushed (ms since the epoch).
    pub pushed_ms: u64,
    /// A generation model's context length in tokens (prompt plus output),
    /// read from the file at push time so that `submit` can refuse a
    /// `max_tokens` no record could use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<u32>,
    /// A generation model's layers, read at push time, for splitting it
    /// over a group (absent in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(files: &[(&str, &str)]) -> ModelManifest {
        ModelManifest {
            v: crate::SCHEMA_VERSION,
            family: ModelFamily::BertEmbedding,
            files: files
                .iter()
                .map(|(n, h)| ModelFile {
                    name: (*n).into(),
                    bytes: 1,
                    sha256: (*h).into(),
                    chunks: Vec::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn hash_ignores_order_and_sees_content() -> Result<(), crate::CodecError> {
        let a = manifest(&[("a", "1"), ("b", "2")]).content_hash()?;
        let b = manifest(&[("b", "2"), ("a", "1")]).content_hash()?;
        let c = manifest(&[("a", "1"), ("b", "3")]).content_hash()?;
        assert_eq!(a, b);
        assert_ne!(a, c);
        Ok(())
    }
}
