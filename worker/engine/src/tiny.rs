//! Tiny random-weight BERT models for tests and benchmarks.
//!
//! [`write_tiny_bert`] writes a complete `bert-embedding` model folder
//! (config.json, tokenizer.json with a small WordPiece vocabulary,
//! model.safetensors with random weights) that loads through exactly the same
//! code path as a real pretrained model.

use std::collections::BTreeMap;
use std::path::Path;

use super::{BertConfig, ModelError};
use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};

const SPECIAL: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
const WORDS: &str = "the a an and or of to in on at for with by from is are was were be been it this that \
these those he she they we you i my your our their his her its not no yes all any some many much more most \
one two three four five six seven eight nine ten man woman girl boy child baby dog cat horse bird car bus train \
food bread apple water coffee tea music song book page word text line data model shard job worker machine office \
desk laptop screen night day morning evening eat eating drink ride riding carry carrying read reading write writing \
run running play playing sing walk walking sleep sleeping is has have had do does did go goes went new old big small \
good bad fast slow red blue green black white happy sad quick brown fox jumps over lazy street city park river sea";

/// The shape of a tiny model.
#[derive(Debug, Clone, Copy)]
pub struct TinySpec {
    /// Hidden size (embedding dimension).
    pub hidden: usize,
    /// Transformer layers.
    pub layers: usize,
    /// Attention heads (must divide `hidden`).
    pub heads: usize,
    /// Longest sequence in tokens.
    pub max_len: usize,
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            hidden: 32,
            layers: 2,
            heads: 4,
            max_len: 64,
        }
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Cache {
        path: path.display().to_string(),
        source,
    }
}

fn vocab() -> BTreeMap<String, u32> {
    let mut tokens: Vec<String> = SPECIAL.iter().map(|s| (*s).to_owned()).collect();
    for c in ('a'..='z').chain('0'..='9') {
        tokens.push(c.to_string());
    }
    for c in ".,!?'\"-:;()/".chars() {
        tokens.push(c.to_string());
    }
    for c in ('a'..='z').chain('0'..='9') {
        tokens.push(format!("##{c}"));
    }
    for w in WORDS.split_whitespace() {
        if !tokens.iter().any(|t| t == w) {
            tokens.push(w.to_owned());
        }
    }
    tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, u32::try_from(i).unwrap_or(u32::MAX)))
        .collect()
}

fn tokenizer_json(vocab: &BTreeMap<String, u32>) -> serde_json::Value {
    let added: Vec<_> = SPECIAL
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                        "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab}
    })
}

/// Writes a tiny random-weight `bert-embedding` model folder into `dir`.
pub fn write_tiny_bert(dir: &Path, spec: TinySpec) -> Result<(), ModelError> {
    write_bert(dir, spec, |_| Ok(()))
}

/// Writes a tiny `bert-embedding` model folder into `dir`, its weights
/// random, then set by `fill` (which may overwrite any of them) before they
/// are saved.
pub(crate) fn write_bert(
    dir: &Path,
    spec: TinySpec,
    fill: impl FnOnce(&VarMap) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let vocab = vocab();
    let config = BertConfig {
        vocab_size: vocab.len(),
        hidden_size: spec.hidden,
        num_hidden_layers: spec.layers,
        num_attention_heads: spec.heads,
        intermediate_size: spec.hidden * 4,
        hidden_act: "gelu".into(),
        max_position_embeddings: spec.max_len,
        type_vocab_size: 2,
        layer_norm_eps: 1e-12,
        pad_token_id: 0,
        position_embedding_type: "absolute".into(),
    };
    // The config as the encoder reads it, plus what a checkpoint's file
    // also says.
    let mut config_json = serde_json::to_value(&config).map_err(|e| ModelError::Invalid {
        family: "bert-embedding",
        reason: e.to_string(),
    })?;
    if let Some(fields) = config_json.as_object_mut() {
        fields.insert("architectures".into(), serde_json::json!(["BertModel"]));
        fields.insert("model_type".into(), "bert".into());
        fields.insert("hidden_dropout_prob".into(), 0.0.into());
        fields.insert("attention_probs_dropout_prob".into(), 0.0.into());
        fields.insert("initializer_range".into(), 0.02.into());
    }
    let write_json = |name: &str, value: &serde_json::Value| -> Result<(), ModelError> {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(value).map_err(|e| ModelError::Invalid {
            family: "bert-embedding",
            reason: e.to_string(),
        })?;
        std::fs::write(&path, text).map_err(io(&path))
    };
    write_json("config.json", &config_json)?;
    write_json("tokenizer.json", &tokenizer_json(&vocab))?;
    write_json(
        "sentence_bert_config.json",
        &serde_json::json!({"max_seq_length": spec.max_len}),
    )?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    declare_bert(&vb, &config)?;
    fill(&varmap)?;
    varmap.save(dir.join("model.safetensors"))?;
    Ok(())
}

/// Creates every weight of a BERT encoder of shape `c` under `vb`, with
/// the names and shapes of Hugging Face's checkpoints (no pooler), as
/// candle-nn's builders start them: embeddings drawn from N(0, 1), linear
/// layers uniform in ±1/√inputs, layer norms at ones and zeros.
pub(crate) fn declare_bert(vb: &VarBuilder<'_>, c: &BertConfig) -> candle_core::Result<()> {
    let h = c.hidden_size;
    let emb = vb.pp("embeddings");
    candle_nn::embedding(c.vocab_size, h, emb.pp("word_embeddings"))?;
    candle_nn::embedding(c.max_position_embeddings, h, emb.pp("position_embeddings"))?;
    candle_nn::embedding(c.type_vocab_size, h, emb.pp("token_type_embeddings"))?;
    candle_nn::layer_norm(h, c.layer_norm_eps, emb.pp("LayerNorm"))?;
    for i in 0..c.num_hidden_layers {
        let layer = vb.pp(format!("encoder.layer.{i}"));
        let att = layer.pp("attention");
        for name in ["query", "key", "value"] {
            candle_nn::linear(h, h, att.pp("self").pp(name))?;
        }
        candle_nn::linear(h, h, att.pp("output").pp("dense"))?;
        candle_nn::layer_norm(h, c.layer_norm_eps, att.pp("output").pp("LayerNorm"))?;
        candle_nn::linear(h, c.intermediate_size, layer.pp("intermediate").pp("dense"))?;
        candle_nn::linear(c.intermediate_size, h, layer.pp("output").pp("dense"))?;
        candle_nn::layer_norm(h, c.layer_norm_eps, layer.pp("output").pp("LayerNorm"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BertEmbedder, Precision};

    #[test]
    fn tiny_model_loads_and_embeds_unit_vectors() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        write_tiny_bert(dir.path(), TinySpec::default())?;
        let m = BertEmbedder::load(dir.path(), &Device::Cpu, Precision::F32)?;
        let texts: Vec<String> = ["a man is eating food", "the quick brown fox", "zzz qqq", ""]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let v = m.embed(&texts, crate::Batching::texts(2))?;
        assert_eq!(v.len(), texts.len() * m.dim());
        for row in v.chunks(m.dim()) {
            let n: f32 = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((n - 1.0).abs() < 1e-5, "norm {n}");
        }
        // Batching and order do not change a row beyond rounding.
        let one = m.embed(&texts[1..2], crate::Batching::texts(1))?;
        let d = m.dim();
        let max = one
            .iter()
            .zip(&v[d..2 * d])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max < 1e-5, "batching changed a row by {max}");
        // Different texts give different vectors.
        assert!(v[..d] != v[d..2 * d]);
        Ok(())
    }
}
