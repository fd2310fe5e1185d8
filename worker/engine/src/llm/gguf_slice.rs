//! A group stage's slice of a GGUF file: the byte ranges that layers
//! `a..b` of a llama model need (the header, every tensor outside the
//! layers — embeddings, output norm, head — and those layers' tensors),
//! read from the file's first bytes, so a stage fetches only those.

use std::io::Cursor;
use std::ops::Range;

use candle_core::quantized::gguf_file::Content;

use crate::ModelError;

/// Largest GGUF header (metadata and tensor table) read to plan a slice.
pub const MAX_HEADER_BYTES: u64 = 512 << 20;

/// Where each tensor of a GGUF file lies.
#[derive(Debug, Clone)]
pub struct GgufLayout {
    data_offset: u64,
    tensors: Vec<(String, Range<u64>)>,
}

fn invalid(reason: impl std::fmt::Display) -> ModelError {
    ModelError::Invalid {
        family: "llm-generation",
        reason: reason.to_string(),
    }
}

impl GgufLayout {
    /// Reads the layout from `prefix`, the first bytes of a file of
    /// `file_len` bytes: `Ok(None)` when the header goes on past the
    /// prefix (read more), an error when it is not a GGUF file, its header
    /// is larger than [`MAX_HEADER_BYTES`] or a tensor lies past the end.
    pub fn read(prefix: &[u8], file_len: u64) -> Result<Option<Self>, ModelError> {
        if prefix.len() >= 4 && &prefix[..4] != b"GGUF" {
            return Err(invalid("not a GGUF file (its first bytes are not GGUF)"));
        }
        let content = match Content::read(&mut Cursor::new(prefix)) {
            Ok(c) => c,
            Err(e) => {
                let whole = prefix.len() as u64 >= file_len;
                if whole || prefix.len() as u64 >= MAX_HEADER_BYTES {
                    return Err(invalid(format!(
                        "the GGUF header cannot be read from its first {} bytes: {e}",
                        prefix.len()
                    )));
                }
                return Ok(None);
            }
        };
        let mut tensors = Vec::with_capacity(content.tensor_infos.len());
        for (name, info) in &content.tensor_infos {
            let start = content.tensor_data_offset.checked_add(info.offset);
            let end = start.and_then(|s| s.checked_add(super::gguf::stored_bytes(info)));
            match (start, end) {
                (Some(s), Some(e)) if e <= file_len => tensors.push((name.clone(), s..e)),
                _ => {
                    return Err(invalid(format!(
                        "tensor {name} ends past the end of the file ({file_len} bytes)"
                    )));
                }
            }
        }
        tensors.sort_by_key(|t| t.1.start);
        Ok(Some(Self {
            data_offset: content.tensor_data_offset,
            tensors,
        }))
    }

    /// The byte ranges, sorted and merged, that a stage holding `layers`
    /// reads: the header, every tensor not in a block (`blk.N.`), and the
    /// tensors of blocks in `layers`.
    pub fn stage_ranges(&self, layers: Range<usize>) -> Vec<Range<u64>> {
        let wanted = |name: &str| match block_of(name) {
            Some(b) => layers.contains(&b),
            None => true,
        };
        let mut out: Vec<Range<u64>> = Vec::new();
        out.push(0..self.data_offset);
        for (_, r) in self.tensors.iter().filter(|(n, _)| wanted(n)) {
            match out.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => out.push(r.clone()),
            }
        }
        out
    }
}

/// The block a tensor named `blk.N.…` belongs to.
fn block_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Whether `range` lies inside one of `present` (sorted, merged).
pub fn covered(present: &[Range<u64>], range: &Range<u64>) -> bool {
    present
        .iter()
        .any(|p| p.start <= range.start && range.end <= p.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_read_from_names() {
        assert_eq!(block_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(block_of("token_embd.weight"), None);
        assert_eq!(block_of("blk.x.attn_q.weight"), None);
    }

    #[test]
    fn a_stage_reads_the_header_the_shared_tensors_and_its_blocks() {
        let layout = GgufLayout {
            data_offset: 100,
            tensors: vec![
                ("token_embd.weight".into(), 100..200),
                ("blk.0.a".into(), 200..250),
                ("blk.0.b".into(), 250..300),
                ("blk.1.a".into(), 300..400),
                ("blk.2.a".into(), 400..500),
                ("output_norm.weight".into(), 500..510),
            ],
        };
        assert_eq!(layout.stage_ranges(0..1), vec![0..300, 500..510]);
        assert_eq!(layout.stage_ranges(1..2), vec![0..200, 300..400, 500..510]);
        assert_eq!(layout.stage_ranges(2..3), vec![0..200, 400..510]);
        let present = layout.stage_ranges(1..2);
        assert!(covered(&present, &(300..400)));
        assert!(!covered(&present, &(250..300)));
        assert!(!covered(&present, &(350..450)));
    }

    #[test]
    fn a_header_past_the_prefix_asks_for_more_and_another_format_is_refused() {
        let mut h = b"GGUF".to_vec();
        h.extend_from_slice(&3u32.to_le_bytes());
        assert!(matches!(GgufLayout::read(&h, 1 << 30), Ok(None)));
        assert!(GgufLayout::read(&h, h.len() as u64).is_err());
        assert!(GgufLayout::read(b"PK\x03\x04 a zip", 1 << 30).is_err());
    }
}
