//! BERT sentence embeddings as sentence-transformers computes them for
//! all-MiniLM-L6-v2: WordPiece tokens truncated at the model's max sequence
//! length, padded to the longest text in the batch, mean pooling over real
//! tokens, L2 normalisation.

use std::path::Path;

use crate::BertConfig;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use minions_schemas::messages::{ModelFamily, OutputPayload};
use tokenizers::{Tokenizer, TruncationParams};

use super::encoder::{Encoder, mean_pool_normalise};
use super::{Batching, Model, ModelError};
use crate::EnginePath;
use crate::kernels::in_pool;
use minions_schemas::messages::Precision;

const FAMILY: &str = "bert-embedding";

/// A loaded BERT sentence-embedding model on one device.
pub struct BertEmbedder {
    model: Encoder,
    tokenizer: Tokenizer,
    max_len: usize,
    dim: usize,
    pad_id: u32,
    /// Multiply-adds of the linear layers per token, all layers.
    macs_per_token: u64,
}

fn invalid(reason: impl Into<String>) -> ModelError {
    ModelError::Invalid {
        family: FAMILY,
        reason: reason.into(),
    }
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, ModelError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|e| invalid(format!("cannot read {name}: {e}")))
}

#[derive(serde::Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

impl BertEmbedder {
    /// Loads `config.json`, `tokenizer.json` and `model.safetensors` from
    /// `dir` (plus `sentence_bert_config.json` for the max sequence length,
    /// when present) onto `device`, its linear layers in `precision`, on
    /// the fast path ([`EnginePath::Fast`]).
    pub fn load(dir: &Path, device: &Device, precision: Precision) -> Result<Self, ModelError> {
        Self::load_with(dir, device, precision, EnginePath::Fast)
    }

    /// [`BertEmbedder::load`], to run the code `path` names.
    pub fn load_with(
        dir: &Path,
        device: &Device,
        precision: Precision,
        path: EnginePath,
    ) -> Result<Self, ModelError> {
        let config: BertConfig = serde_json::from_slice(&read(dir, "config.json")?)
            .map_err(|e| invalid(format!("config.json: {e}")))?;
        let max_len = match read(dir, "sentence_bert_config.json") {
            Ok(bytes) => {
                serde_json::from_slice::<SentenceBertConfig>(&bytes)
                    .map_err(|e| invalid(format!("sentence_bert_config.json: {e}")))?
                    .max_seq_length
            }
            Err(_) => None,
        }
        .unwrap_or(config.max_position_embeddings)
        .min(config.max_position_embeddings);
        let mut tokenizer = Tokenizer::from_bytes(read(dir, "tokenizer.json")?)
            .map_err(|e| invalid(format!("tokenizer.json: {e}")))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                ..Default::default()
            }))
            .map_err(|e| invalid(format!("tokenizer truncation: {e}")))?;
        tokenizer.with_padding(None);
        let pad_id =
            u32::try_from(config.pad_token_id).map_err(|_| invalid("pad_token_id out of range"))?;
        let weights = read(dir, "model.safetensors")?;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, device)
            .map_err(|e| invalid(format!("model.safetensors: {e}")))?;
        let precision = path.runs_as(device, precision);
        let model = Encoder::load(vb, &config, precision, path.host_kernels(device))
            .map_err(|e| invalid(format!("model.safetensors: {e}")))?;
        Ok(Self {
            model,
            tokenizer,
            max_len,
            dim: config.hidden_size,
            pad_id,
            macs_per_token: {
                let (h, i) = (config.hidden_size as u64, config.intermediate_size as u64);
                config.num_hidden_layers as u64 * (4 * h * h + 2 * h * i)
            },
        })
    }

    /// The embedding dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The longest token sequence a text is cut to.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The multiply-adds of the linear layers (query, key, value, the
    /// attention's output, the feed-forward block) that embedding `texts`
    /// takes, counted over their tokens after truncation; attention's
    /// products, which grow with the square of a text's length, are left
    /// out. What a benchmark divides by its time to set a run against the
    /// CPU's peak.
    pub fn product_macs(&self, texts: &[String]) -> Result<u64, ModelError> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| ModelError::BadInput(format!("tokenizer: {e}")))?;
        let tokens: u64 = encodings.iter().map(|e| e.get_ids().len() as u64).sum();
        Ok(tokens * self.macs_per_token)
    }

    /// Embeds `texts`, returning `texts.len() × dim` floats in input order.
    ///
    /// Texts are sorted by token length and run in passes cut as
    /// `batching` says, so each pass pads little; rows are put back in
    /// input order.
    pub fn embed(&self, texts: &[String], batching: Batching) -> Result<Vec<f32>, ModelError> {
        in_pool(self.model.device(), || self.embed_here(texts, batching))
    }

    /// [`BertEmbedder::embed`] on this thread.
    fn embed_here(&self, texts: &[String], batching: Batching) -> Result<Vec<f32>, ModelError> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| ModelError::BadInput(format!("tokenizer: {e}")))?;
        let mut order: Vec<usize> = (0..encodings.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(encodings[i].get_ids().len()));
        let mut out = vec![0f32; texts.len() * self.dim];
        let lens: Vec<usize> = order
            .iter()
            .map(|&i| encodings[i].get_ids().len())
            .collect();
        for pass in batching.passes(&lens) {
            let chunk = &order[pass];
            let len = chunk
                .iter()
                .map(|&i| encodings[i].get_ids().len())
                .max()
                .unwrap_or(0)
                .max(1);
            let mut ids = Vec::with_capacity(chunk.len() * len);
            let mut mask = Vec::with_capacity(chunk.len() * len);
            for &i in chunk {
                let e = encodings[i].get_ids();
                ids.extend_from_slice(e);
                ids.extend(std::iter::repeat_n(self.pad_id, len - e.len()));
                mask.extend(std::iter::repeat_n(1u32, e.len()));
                mask.extend(std::iter::repeat_n(0u32, len - e.len()));
            }
            let rows = self.forward(ids, mask, chunk.len(), len)?;
            for (r, &i) in chunk.iter().enumerate() {
                out[i * self.dim..(i + 1) * self.dim]
                    .copy_from_slice(&rows[r * self.dim..(r + 1) * self.dim]);
            }
        }
        Ok(out)
    }

    fn forward(
        &self,
        ids: Vec<u32>,
        mask: Vec<u32>,
        batch: usize,
        len: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let device = self.model.device();
        let ids = Tensor::from_vec(ids, (batch, len), device)?;
        let mask = Tensor::from_vec(mask, (batch, len), device)?;
        let states = self.model.forward(&ids, &mask)?;
        let pooled = mean_pool_normalise(&states, &mask)?;
        Ok(pooled.flatten_all()?.to_vec1::<f32>()?)
    }
}

impl Model for BertEmbedder {
    fn family(&self) -> ModelFamily {
        ModelFamily::BertEmbedding
    }

    fn run(&self, texts: &[String], batching: Batching) -> Result<OutputPayload, ModelError> {
        let vectors = self.embed(texts, batching)?;
        let mut data = Vec::with_capacity(vectors.len() * 4);
        for v in vectors {
            data.extend_from_slice(&v.to_le_bytes());
        }
        Ok(OutputPayload::Embeddings {
            dim: u32::try_from(self.dim).map_err(|_| invalid("hidden size out of range"))?,
            data,
        })
    }
}
