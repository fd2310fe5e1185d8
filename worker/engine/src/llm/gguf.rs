//! Reading a GGUF file: its metadata, the architecture's hyper-parameters,
//! and its tensors, with clear errors for files that are not GGUF, are
//! truncated, or hold an architecture this engine does not run.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{Content, Value};

use crate::ModelError;

/// Architectures (`general.architecture`) whose transformer this engine runs.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama"];

/// Largest GGUF file the engine opens (a model that would not fit any
/// machine of the fleet; also bounds what a forged header can claim).
pub const MAX_GGUF_BYTES: u64 = 64 << 30;

/// An open GGUF file: parsed header and metadata, tensors still on disk.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
    /// The byte ranges the file holds, where it is a stage's slice (the
    /// rest was never fetched); `None`: all of it.
    present: Option<Vec<std::ops::Range<u64>>>,
}

/// A GGUF file on disk: whole, or a group stage's slice of one that holds
/// only `present` (sorted, merged byte ranges) and reads as zeros
/// elsewhere; a tensor outside them is refused, never read.
#[derive(Debug, Clone)]
pub struct GgufPieces {
    /// The file.
    pub path: PathBuf,
    /// The byte ranges it holds; `None`: all of it.
    pub present: Option<Vec<std::ops::Range<u64>>>,
}

impl GgufPieces {
    /// The whole file at `path`.
    pub fn whole(path: PathBuf) -> Self {
        Self {
            path,
            present: None,
        }
    }
}

fn invalid(path: &Path, reason: impl std::fmt::Display) -> ModelError {
    ModelError::Invalid {
        family: "llm-generation",
        reason: format!("{}: {reason}", path.display()),
    }
}

impl GgufFile {
    /// Opens `path`, reads its header and checks that every tensor lies
    /// inside the file (a truncated download fails here, not mid-load).
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let file = File::open(path).map_err(|e| invalid(path, format!("cannot open: {e}")))?;
        let len = file
            .metadata()
            .map_err(|e| invalid(path, format!("cannot stat: {e}")))?
            .len();
        if len > MAX_GGUF_BYTES {
            return Err(invalid(
                path,
                format!("{len} bytes; the limit is {MAX_GGUF_BYTES}"),
            ));
        }
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| {
            invalid(
                path,
                format!("not a readable GGUF file ({e}); is it truncated or another format?"),
            )
        })?;
        for (name, info) in &content.tensor_infos {
            let end = content
                .tensor_data_offset
                .checked_add(info.offset)
                .and_then(|o| o.checked_add(stored_bytes(info)));
            match end {
                Some(end) if end <= len => {}
                _ => {
                    return Err(invalid(
                        path,
                        format!(
                            "truncated: tensor {name} ends past the end of the file ({len} bytes)"
                        ),
                    ));
                }
            }
        }
        Ok(Self {
            path: path.to_owned(),
            content,
            reader,
            present: None,
        })
    }

    /// Opens `pieces`: a whole file as [`GgufFile::open`] does, a slice
    /// with its header inside what it holds.
    pub fn open_pieces(pieces: &GgufPieces) -> Result<Self, ModelError> {
        let path = &pieces.path;
        if let Some(present) = &pieces.present {
            // The header is read before anything else: it must be there.
            let header = 0..1;
            if !crate::llm::gguf_slice::covered(present, &header) {
                return Err(invalid(path, "the slice does not hold the file's header"));
            }
        }
        let mut f = Self::open(path)?;
        if let Some(present) = &pieces.present
            && !crate::llm::gguf_slice::covered(present, &(0..f.content.tensor_data_offset))
        {
            return Err(invalid(
                path,
                "the slice does not hold the file's whole header",
            ));
        }
        f.present = pieces.present.clone();
        Ok(f)
    }

    /// The file's path, for errors.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All metadata keys and values.
    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    /// A metadata value, or an error naming the missing key.
    pub fn get(&self, key: &str) -> Result<&Value, ModelError> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| invalid(&self.path, format!("metadata key {key} is missing")))
    }

    /// A string value.
    pub fn string(&self, key: &str) -> Result<&str, ModelError> {
        self.get(key)?
            .to_string()
            .map(String::as_str)
            .map_err(|_| invalid(&self.path, format!("metadata key {key} is not a string")))
    }

    /// An unsigned integer value of any width.
    pub fn uint(&self, key: &str) -> Result<u64, ModelError> {
        let v = self.get(key)?;
        let n = match v {
            Value::U8(x) => Some(u64::from(*x)),
            Value::U16(x) => Some(u64::from(*x)),
            Value::U32(x) => Some(u64::from(*x)),
            Value::U64(x) => Some(*x),
            Value::I8(x) => u64::try_from(*x).ok(),
            Value::I16(x) => u64::try_from(*x).ok(),
            Value::I32(x) => u64::try_from(*x).ok(),
            Value::I64(x) => u64::try_from(*x).ok(),
            _ => None,
        };
        n.ok_or_else(|| {
            invalid(
                &self.path,
                format!("metadata key {key} is not a non-negative integer"),
            )
        })
    }

    /// An optional unsigned integer value.
    pub fn uint_opt(&self, key: &str) -> Result<Option<u64>, ModelError> {
        if self.content.metadata.contains_key(key) {
            self.uint(key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A float value, or `default` when absent.
    pub fn float_or(&self, key: &str, default: f64) -> Result<f64, ModelError> {
        match self.content.metadata.get(key) {
            None => Ok(default),
            Some(Value::F32(x)) => Ok(f64::from(*x)),
            Some(Value::F64(x)) => Ok(*x),
            Some(_) => Err(invalid(
                &self.path,
                format!("metadata key {key} is not a float"),
            )),
        }
    }

    /// A boolean value, or `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.content.metadata.get(key) {
            None => Ok(default),
            Some(v) => v
                .to_bool()
                .map_err(|_| invalid(&self.path, format!("metadata key {key} is not a boolean"))),
        }
    }

    /// An array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<String>, ModelError> {
        let arr = self
            .get(key)?
            .to_vec()
            .map_err(|_| invalid(&self.path, format!("metadata key {key} is not an array")))?;
        arr.iter()
            .map(|v| {
                v.to_string().cloned().map_err(|_| {
                    invalid(&self.path, format!("metadata key {key} holds a non-string"))
                })
            })
            .collect()
    }

    /// An array of integers (token types).
    pub fn ints(&self, key: &str) -> Result<Vec<i64>, ModelError> {
        let arr = self
            .get(key)?
            .to_vec()
            .map_err(|_| invalid(&self.path, format!("metadata key {key} is not an array")))?;
        arr.iter()
            .map(|v| match v {
                Value::I32(x) => Ok(i64::from(*x)),
                Value::U32(x) => Ok(i64::from(*x)),
                Value::I64(x) => Ok(*x),
                Value::U8(x) => Ok(i64::from(*x)),
                Value::I8(x) => Ok(i64::from(*x)),
                Value::U16(x) => Ok(i64::from(*x)),
                Value::I16(x) => Ok(i64::from(*x)),
                _ => Err(invalid(
                    &self.path,
                    format!("metadata key {key} holds a non-integer"),
                )),
            })
            .collect()
    }

    /// Whether the file holds a tensor `name`.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads tensor `name` onto `device`.
    pub fn tensor(&mut self, name: &str, device: &Device) -> Result<QTensor, ModelError> {
        let Some(info) = self.content.tensor_infos.get(name) else {
            return Err(invalid(&self.path, format!("tensor {name} is missing")));
        };
        if let Some(present) = &self.present {
            let start = self.content.tensor_data_offset + info.offset;
            if !crate::llm::gguf_slice::covered(present, &(start..start + stored_bytes(info))) {
                return Err(invalid(
                    &self.path,
                    format!("tensor {name} is not in this stage's slice of the file"),
                ));
            }
        }
        self.content
            .tensor(&mut self.reader, name, device)
            .map_err(|e| invalid(&self.path, format!("tensor {name}: {e}")))
    }

    /// Bytes of all tensors together (what the weights take in memory).
    pub fn tensor_bytes(&self) -> u64 {
        self.content.tensor_infos.values().map(stored_bytes).sum()
    }
}

/// Bytes a tensor takes in the file (and quantized, in memory).
pub(crate) fn stored_bytes(info: &candle_core::quantized::gguf_file::TensorInfo) -> u64 {
    let block = info.ggml_dtype.block_size().max(1);
    (info.shape.elem_count() / block * info.ggml_dtype.type_size()) as u64
}

/// A llama-family transformer's shape, from `<arch>.*` metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// The architecture name (`llama`).
    pub arch: String,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Feed-forward inner size.
    pub ffn: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Longest sequence the model was trained for (prompt and output).
    pub context: usize,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// RMS norm epsilon.
    pub rms_eps: f64,
    /// Vocabulary size.
    pub vocab: usize,
}

impl LlamaConfig {
    /// Reads the hyper-parameters of `file`'s architecture; an architecture
    /// this engine does not run is an error naming it.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let arch = file.string("general.architecture")?.to_owned();
        if !SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
            return Err(invalid(
                file.path(),
                format!(
                    "architecture {arch:?} is not supported (supported: {})",
                    SUPPORTED_ARCHITECTURES.join(", ")
                ),
            ));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let usize_of = |k: &str| -> Result<usize, ModelError> {
            usize::try_from(file.uint(&key(k))?)
                .map_err(|_| invalid(file.path(), format!("{} is too large", key(k))))
        };
        let hidden = usize_of("embedding_length")?;
        let heads = usize_of("attention.head_count")?;
        let kv_heads = match file.uint_opt(&key("attention.head_count_kv"))? {
            Some(n) => usize::try_from(n).unwrap_or(0),
            None => heads,
        };
        if heads == 0 || kv_heads == 0 || hidden % heads != 0 || heads % kv_heads != 0 {
            return Err(invalid(
                file.path(),
                format!("inconsistent heads: {heads} query, {kv_heads} key/value, hidden {hidden}"),
            ));
        }
        let head_dim = hidden / heads;
        if let Some(rot) = file.uint_opt(&key("rope.dimension_count"))?
            && rot as usize != head_dim
        {
            return Err(invalid(
                file.path(),
                format!("partial rotary embeddings ({rot} of {head_dim}) are not supported"),
            ));
        }
        let vocab = match file.uint_opt(&key("vocab_size"))? {
            Some(v) => v as usize,
            None => file.strings("tokenizer.ggml.tokens")?.len(),
        };
        Ok(Self {
            layers: usize_of("block_count")?,
            hidden,
            ffn: usize_of("feed_forward_length")?,
            heads,
            kv_heads,
            head_dim,
            context: usize_of("context_length")?,
            rope_base: file.float_or(&key("rope.freq_base"), 10_000.0)? as f32,
            rms_eps: file.float_or(&key("attention.layer_norm_rms_epsilon"), 1e-5)?,
            vocab,
            arch,
        })
    }

    /// Bytes one token's keys and values take across all layers (f32).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layers * 2 * self.kv_heads * self.head_dim * 4
    }
}
