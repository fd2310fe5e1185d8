//! A BERT checkpoint's `config.json`: the fields the encoder reads, with
//! Hugging Face's defaults where a file may leave one out.

use serde::{Deserialize, Serialize};

/// The shape and settings of a BERT encoder, read from and written as
/// `config.json` (tiny test models). Unknown fields are ignored;
/// the activation and position-embedding kinds are kept as written, so
/// that the encoder can refuse what it does not run by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BertConfig {
    /// Rows of the word-embedding table.
    pub vocab_size: usize,
    /// Width of every token state.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads; divides `hidden_size`.
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// The feed-forward activation's name (`gelu` is the erf GELU).
    #[serde(default = "gelu")]
    pub hidden_act: String,
    /// Rows of the position-embedding table: the longest input.
    pub max_position_embeddings: usize,
    /// Rows of the token-type table.
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    /// The layer norms' epsilon.
    #[serde(default = "eps")]
    pub layer_norm_eps: f64,
    /// The padding token's id.
    #[serde(default)]
    pub pad_token_id: usize,
    /// How positions are embedded (`absolute` is the only kind run).
    #[serde(default = "absolute")]
    pub position_embedding_type: String,
}

fn gelu() -> String {
    "gelu".into()
}

fn two() -> usize {
    2
}

fn eps() -> f64 {
    1e-12
}

fn absolute() -> String {
    "absolute".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_checkpoint_config_with_defaults() -> Result<(), serde_json::Error> {
        let c: BertConfig = serde_json::from_str(
            r#"{"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
                "num_attention_heads": 12, "intermediate_size": 1536,
                "max_position_embeddings": 512, "architectures": ["BertModel"]}"#,
        )?;
        assert_eq!(c.hidden_act, "gelu");
        assert_eq!(c.position_embedding_type, "absolute");
        assert_eq!((c.type_vocab_size, c.pad_token_id), (2, 0));
        assert!(serde_json::from_str::<BertConfig>(r#"{"vocab_size": 3}"#).is_err());
        Ok(())
    }
}
