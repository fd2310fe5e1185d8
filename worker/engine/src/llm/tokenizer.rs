//! The tokenizer a GGUF file carries (`tokenizer.ggml.*`), rebuilt to split
//! text exactly as llama.cpp does for the file's `tokenizer.ggml.pre`.
//!
//! Byte-level BPE (`tokenizer.ggml.model = gpt2`) only: vocabulary and
//! merges from the metadata, the pre-tokenizer regexes llama.cpp uses for
//! the named `pre` (an unknown name is refused rather than guessed: a
//! default that adds a leading space silently changes every prompt), and
//! control tokens recognised in the text, as llama.cpp's server does.

use std::collections::HashMap;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::gguf::GgufFile;
use crate::ModelError;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// GPT-2's regex, which llama.cpp runs for `gpt-2` and (after splitting
/// digits) for `smollm` and its kin.
const REGEX_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's regex as llama.cpp adapts it (case-insensitive contractions).
const REGEX_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: as Llama 3's, digits one by one.
const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Token texts that end a generation when the model emits them (llama.cpp's
/// end-of-generation set beyond the EOS id).
const END_OF_GENERATION: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
];

/// The regexes llama.cpp applies, in order, for a `pre` name, and whether
/// merges may be skipped for whole-word vocabulary hits.
fn pre_tokenizer_for(pre: &str) -> Option<(&'static [&'static str], bool)> {
    Some(match pre {
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            (&[r"\p{N}", REGEX_GPT2], false)
        }
        "gpt-2" | "phi-2" | "olmo" | "mpt" => (&[REGEX_GPT2], false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe" => (&[REGEX_LLAMA3], true),
        "qwen2" | "deepseek-r1-qwen" => (&[REGEX_QWEN2], false),
        _ => return None,
    })
}

/// A GGUF file's tokenizer.
pub struct GgufTokenizer {
    inner: Tokenizer,
    /// Token text by id, as the vocabulary stores it (byte-level encoded).
    tokens: Vec<String>,
    /// Per id: a control token (never part of generated text).
    control: Vec<bool>,
    /// Per id: a user-defined token (its text is raw, not byte-encoded).
    user_defined: Vec<bool>,
    /// Byte-level character to byte.
    byte_of: HashMap<char, u8>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    end_of_generation: Vec<u32>,
}

fn invalid(reason: impl std::fmt::Display) -> ModelError {
    ModelError::Invalid {
        family: "llm-generation",
        reason: format!("tokenizer: {reason}"),
    }
}

/// GPT-2's reversible map from bytes to printable characters.
fn bytes_to_chars() -> Vec<(u8, char)> {
    let mut out = Vec::with_capacity(256);
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            u32::from(b)
        } else {
            n += 1;
            255 + n
        };
        out.push((b, char::from_u32(c).unwrap_or('\u{fffd}')));
    }
    out
}

impl GgufTokenizer {
    /// Builds the tokenizer from `file`'s metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let model = file.string("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(invalid(format!(
                "tokenizer.ggml.model {model:?} is not supported (byte-level BPE, \"gpt2\", is)"
            )));
        }
        let pre = match file.metadata().get("tokenizer.ggml.pre") {
            Some(_) => file.string("tokenizer.ggml.pre")?.to_owned(),
            None => "gpt-2".to_owned(),
        };
        let Some((regexes, ignore_merges)) = pre_tokenizer_for(&pre) else {
            return Err(invalid(format!(
                "tokenizer.ggml.pre {pre:?} is not supported; its splitting rules are unknown here"
            )));
        };
        let tokens = file.strings("tokenizer.ggml.tokens")?;
        let types = match file.metadata().get("tokenizer.ggml.token_type") {
            Some(_) => file.ints("tokenizer.ggml.token_type")?,
            None => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(invalid(format!(
                "{} token types for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        let merges = file
            .strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| invalid(format!("merge {m:?} is not two tokens")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .build()
            .map_err(invalid)?;
        let mut inner = Tokenizer::new(bpe);
        let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
        for re in regexes {
            let split = Split::new(
                SplitPattern::Regex((*re).to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(invalid)?;
            steps.push(split.into());
        }
        // The regexes have split already: byte-level only maps bytes.
        steps.push(ByteLevel::new(false, false, false).into());
        inner.with_pre_tokenizer(Some(Sequence::new(steps)));

        let control: Vec<bool> = types.iter().map(|&t| t == TYPE_CONTROL).collect();
        let user_defined: Vec<bool> = types.iter().map(|&t| t == TYPE_USER_DEFINED).collect();
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, t)| **t == TYPE_CONTROL || **t == TYPE_USER_DEFINED)
            .map(|(tok, _)| AddedToken::from(tok.clone(), true))
            .collect();
        inner.add_special_tokens(specials).map_err(invalid)?;

        let id = |key: &str| -> Result<Option<u32>, ModelError> {
            Ok(file
                .uint_opt(key)?
                .and_then(|v| u32::try_from(v).ok())
                .filter(|&v| (v as usize) < tokens.len()))
        };
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let eos = id("tokenizer.ggml.eos_token_id")?;
        let eot = id("tokenizer.ggml.eot_token_id")?;
        let add_bos = file.bool_or("tokenizer.ggml.add_bos_token", ignore_merges)?;
        let mut end_of_generation: Vec<u32> = eos.into_iter().chain(eot).collect();
        for (i, t) in tokens.iter().enumerate() {
            if control[i] && END_OF_GENERATION.contains(&t.as_str()) {
                end_of_generation.push(i as u32);
            }
        }
        end_of_generation.sort_unstable();
        end_of_generation.dedup();
        let byte_of = bytes_to_chars().into_iter().map(|(b, c)| (c, b)).collect();
        Ok(Self {
            inner,
            tokens,
            control,
            user_defined,
            byte_of,
            bos,
            eos,
            add_bos,
            end_of_generation,
        })
    }

    /// Token ids of `text`, control tokens written in it recognised as
    /// such, BOS first when the model asks for it and `add_bos` is set.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| ModelError::BadInput(format!("text does not tokenize: {e}")))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos
            && self.add_bos
            && let Some(b) = self.bos
        {
            ids.push(b);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The bytes of `ids` as generated text: control tokens render as
    /// nothing, byte-level characters map back to their bytes.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            let i = id as usize;
            let Some(tok) = self.tokens.get(i) else {
                continue;
            };
            if self.control[i] {
                continue;
            }
            if self.user_defined[i] {
                out.extend_from_slice(tok.as_bytes());
                continue;
            }
            for c in tok.chars() {
                match self.byte_of.get(&c) {
                    Some(b) => out.push(*b),
                    None => {
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
        out
    }

    /// `ids` as text (invalid UTF-8, as from a cut multi-byte character,
    /// becomes U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// The vocabulary's token text of `id`.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Whether generating `id` ends a sequence.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.end_of_generation.binary_search(&id).is_ok()
    }

    /// The BOS token's text, for chat templates.
    pub fn bos_text(&self) -> &str {
        self.bos.and_then(|b| self.token_text(b)).unwrap_or("")
    }

    /// The EOS token's text, for chat templates.
    pub fn eos_text(&self) -> &str {
        self.eos.and_then(|b| self.token_text(b)).unwrap_or("")
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let map = bytes_to_chars();
        let mut chars: Vec<char> = map.iter().map(|(_, c)| *c).collect();
        chars.sort_unstable();
        chars.dedup();
        assert_eq!(chars.len(), 256);
        assert_eq!(map[b' ' as usize].1, '\u{120}');
        assert_eq!(map[b'\n' as usize].1, '\u{10a}');
        assert_eq!(map[b'A' as usize].1, 'A');
    }

    #[test]
    fn unknown_pre_tokenizers_are_refused() {
        assert!(pre_tokenizer_for("smollm").is_some());
        assert!(pre_tokenizer_for("llama-bpe").is_some());
        assert!(pre_tokenizer_for("no-such-pre").is_none());
    }
}
