//! CTranslate2's `model.bin`: the file format faster-whisper's model
//! folders use, read into named tensors.
//!
//! The layout (little-endian), as CTranslate2 writes it:
//! - `u32` binary version (6), a string spec name (`WhisperSpec`), `u32`
//!   spec revision, `u32` variable count;
//! - per variable: a string name, `u8` rank, `u32` per dimension, `u8`
//!   data type, `u32` byte count, the data;
//! - `u32` alias count, then per alias two strings (alias, target).
//!
//! A string is a `u16` length that counts a trailing NUL, then the bytes.
//! Every count and size is checked against the bytes left before anything
//! is allocated, so a truncated or hostile file is refused with what and
//! where, never read past its end.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::ModelError;

/// The binary version this reader knows (CTranslate2 4.x writes 6).
pub const BINARY_VERSION: u32 = 6;
/// The largest `model.bin` accepted: Whisper large-v3 in f32 is 6.2 GB.
pub const MAX_FILE_BYTES: u64 = 8 << 30;
/// The most variables a file may declare (Whisper large has about 1,300).
const MAX_VARIABLES: u32 = 100_000;
/// The most dimensions a variable may have.
const MAX_RANK: u8 = 8;

/// A variable's element type, as CTranslate2 numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ct2Type {
    /// 32-bit float (id 0).
    F32,
    /// 8-bit integer (id 1): quantised weights, or small scalars.
    I8,
    /// 16-bit integer (id 2).
    I16,
    /// 32-bit integer (id 3).
    I32,
    /// IEEE half (id 4).
    F16,
    /// bfloat16 (id 5).
    Bf16,
}

impl Ct2Type {
    fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::I8,
            2 => Self::I16,
            3 => Self::I32,
            4 => Self::F16,
            5 => Self::Bf16,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::I8 => 1,
            Self::I16 | Self::F16 | Self::Bf16 => 2,
            Self::F32 | Self::I32 => 4,
        }
    }
}

/// One variable: its shape, type and where its bytes lie in the file.
#[derive(Clone, Debug)]
pub struct Ct2Var {
    /// Dimensions, outermost first (empty for a scalar).
    pub dims: Vec<usize>,
    /// Element type.
    pub dtype: Ct2Type,
    /// Byte range in the file's buffer.
    range: std::ops::Range<usize>,
}

/// A parsed `model.bin`: its spec and variables, aliases resolved (an
/// alias is a second name for the same bytes).
pub struct Ct2File {
    /// The spec's name, such as `WhisperSpec`.
    pub spec: String,
    /// The spec's revision.
    pub revision: u32,
    bytes: Vec<u8>,
    vars: HashMap<String, Ct2Var>,
}

/// A bounds-checked cursor over the file.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ModelError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(bad(format!(
                "truncated: {what} needs {n} bytes at offset {}, the file has {}",
                self.at,
                self.bytes.len()
            )));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, ModelError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, ModelError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self, what: &str) -> Result<String, ModelError> {
        let n = self.u16(what)? as usize;
        let raw = self.take(n, what)?;
        let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
        String::from_utf8(raw.to_vec()).map_err(|_| bad(format!("{what} is not UTF-8")))
    }
}

/// The family's name in load errors.
pub(crate) const FAMILY: &str = "whisper-speech";

fn bad(msg: String) -> ModelError {
    ModelError::Invalid {
        family: FAMILY,
        reason: format!("model.bin (CTranslate2): {msg}"),
    }
}

fn io(path: &Path, source: std::io::Error) -> ModelError {
    ModelError::Cache {
        path: path.display().to_string(),
        source,
    }
}

impl Ct2File {
    /// Reads and parses `path`, refusing files over [`MAX_FILE_BYTES`].
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let len = std::fs::metadata(path).map_err(|e| io(path, e))?.len();
        if len > MAX_FILE_BYTES {
            return Err(bad(format!(
                "{} is {len} bytes, over the {MAX_FILE_BYTES}-byte limit",
                path.display()
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| io(path, e))?;
        Self::parse(bytes)
    }

    /// Parses a whole file held in memory.
    pub fn parse(bytes: Vec<u8>) -> Result<Self, ModelError> {
        let mut r = Reader {
            bytes: &bytes,
            at: 0,
        };
        let version = r.u32("the binary version")?;
        if version != BINARY_VERSION {
            return Err(bad(format!(
                "binary version {version}; this reader knows version {BINARY_VERSION} \
                 (convert the model with CTranslate2 4.x)"
            )));
        }
        let spec = r.string("the spec name")?;
        let revision = r.u32("the spec revision")?;
        let count = r.u32("the variable count")?;
        if count > MAX_VARIABLES {
            return Err(bad(format!(
                "{count} variables declared, over {MAX_VARIABLES}"
            )));
        }
        let mut vars = HashMap::with_capacity(count as usize);
        for i in 0..count {
            let name = r.string(&format!("variable {i}'s name"))?;
            let rank = r.u8(&format!("{name}'s rank"))?;
            if rank > MAX_RANK {
                return Err(bad(format!("{name} has rank {rank}, over {MAX_RANK}")));
            }
            let mut dims = Vec::with_capacity(rank as usize);
            for _ in 0..rank {
                dims.push(r.u32(&format!("{name}'s shape"))? as usize);
            }
            let id = r.u8(&format!("{name}'s type"))?;
            let dtype = Ct2Type::from_id(id)
                .ok_or_else(|| bad(format!("{name} has unknown type id {id}")))?;
            let nbytes = r.u32(&format!("{name}'s size"))? as usize;
            let elems = dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| bad(format!("{name}'s shape {dims:?} overflows")))?;
            if elems.checked_mul(dtype.size()) != Some(nbytes) {
                return Err(bad(format!(
                    "{name}: shape {dims:?} of {dtype:?} needs {} bytes, the file says {nbytes}",
                    elems.saturating_mul(dtype.size())
                )));
            }
            let start = r.at;
            r.take(nbytes, &format!("{name}'s data"))?;
            vars.insert(
                name,
                Ct2Var {
                    dims,
                    dtype,
                    range: start..start + nbytes,
                },
            );
        }
        // Files written before aliases existed end here.
        if r.at < bytes.len() {
            let aliases = r.u32("the alias count")?;
            if aliases > MAX_VARIABLES {
                return Err(bad(format!(
                    "{aliases} aliases declared, over {MAX_VARIABLES}"
                )));
            }
            for i in 0..aliases {
                let alias = r.string(&format!("alias {i}"))?;
                let target = r.string(&format!("alias {i}'s target"))?;
                let var = vars.get(&target).cloned().ok_or_else(|| {
                    bad(format!(
                        "alias {alias} names {target}, which is not in the file"
                    ))
                })?;
                vars.insert(alias, var);
            }
        }
        if r.at != bytes.len() {
            return Err(bad(format!(
                "{} bytes left over after the aliases",
                bytes.len() - r.at
            )));
        }
        Ok(Self {
            spec,
            revision,
            bytes,
            vars,
        })
    }

    /// The variable named `name`, if the file has one.
    pub fn var(&self, name: &str) -> Option<&Ct2Var> {
        self.vars.get(name)
    }

    /// Every variable name (aliases included), in no set order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.vars.keys().map(String::as_str)
    }

    /// The variable `name` as an f32 tensor on `device`, checking it has
    /// `dims`; float types are widened, integer types refused (quantised
    /// weights are not read here).
    pub fn tensor(
        &self,
        name: &str,
        dims: &[usize],
        device: &Device,
    ) -> Result<Tensor, ModelError> {
        let v = self
            .var(name)
            .ok_or_else(|| bad(format!("{name} is missing")))?;
        if v.dims != dims {
            return Err(bad(format!(
                "{name} has shape {:?}, expected {dims:?}",
                v.dims
            )));
        }
        let data = self.floats(name, v)?;
        Tensor::from_vec(data, dims, device).map_err(ModelError::from)
    }

    /// The variable's values as f32.
    fn floats(&self, name: &str, v: &Ct2Var) -> Result<Vec<f32>, ModelError> {
        let raw = &self.bytes[v.range.clone()];
        Ok(match v.dtype {
            Ct2Type::F32 => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Ct2Type::F16 => raw
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Ct2Type::Bf16 => raw
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            t => {
                return Err(bad(format!(
                    "{name} is {t:?}: quantised CTranslate2 models are not read; \
                     convert with --quantization float16 or float32"
                )));
            }
        })
    }

    /// An integer scalar (a rank-0 or one-element variable), such as a
    /// layer's head count.
    pub fn scalar(&self, name: &str) -> Result<i64, ModelError> {
        let v = self
            .var(name)
            .ok_or_else(|| bad(format!("{name} is missing")))?;
        let raw = &self.bytes[v.range.clone()];
        if raw.len() != v.dtype.size() {
            return Err(bad(format!("{name} is not a scalar (shape {:?})", v.dims)));
        }
        Ok(match v.dtype {
            Ct2Type::I8 => i64::from(raw[0] as i8),
            Ct2Type::I16 => i64::from(i16::from_le_bytes([raw[0], raw[1]])),
            Ct2Type::I32 => i64::from(i32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]])),
            Ct2Type::F32 => f32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]) as i64,
            Ct2Type::F16 => half::f16::from_le_bytes([raw[0], raw[1]]).to_f32() as i64,
            Ct2Type::Bf16 => half::bf16::from_le_bytes([raw[0], raw[1]]).to_f32() as i64,
        })
    }
}

/// The sizes of a small Whisper model in CTranslate2's layout: what tests
/// and the speech canary build their random-weight models from.
pub(crate) struct TinyWhisper {
    /// Model width (both sides).
    pub(crate) width: u32,
    /// Mel bands.
    pub(crate) mels: u32,
    /// Vocabulary.
    pub(crate) vocab: u32,
    /// Decoder positions.
    pub(crate) text_ctx: u32,
    /// Encoder positions.
    pub(crate) audio_ctx: u32,
    /// Layers on each side.
    pub(crate) layers: usize,
}

impl TinyWhisper {
    /// Every weight's name and dims, as CTranslate2 names them (fused
    /// self-attention QKV, fused cross-attention KV); heads are not
    /// weights and are left to the caller.
    pub(crate) fn variables(&self) -> Vec<(String, Vec<u32>)> {
        let d = self.width;
        let mut vars: Vec<(String, Vec<u32>)> = vec![
            ("encoder/conv1/weight".into(), vec![d, self.mels, 3]),
            ("encoder/conv1/bias".into(), vec![d]),
            ("encoder/conv2/weight".into(), vec![d, d, 3]),
            ("encoder/conv2/bias".into(), vec![d]),
            (
                "encoder/position_encodings/encodings".into(),
                vec![self.audio_ctx, d],
            ),
            ("decoder/embeddings/weight".into(), vec![self.vocab, d]),
            (
                "decoder/position_encodings/encodings".into(),
                vec![self.text_ctx, d],
            ),
        ];
        let linear = |vars: &mut Vec<(String, Vec<u32>)>, p: &str, out: u32, inp: u32| {
            vars.push((format!("{p}/weight"), vec![out, inp]));
            vars.push((format!("{p}/bias"), vec![out]));
        };
        let norm = |vars: &mut Vec<(String, Vec<u32>)>, p: &str| {
            vars.push((format!("{p}/gamma"), vec![d]));
            vars.push((format!("{p}/beta"), vec![d]));
        };
        for side in ["encoder", "decoder"] {
            for l in 0..self.layers {
                let p = format!("{side}/layer_{l}");
                norm(&mut vars, &format!("{p}/self_attention/layer_norm"));
                linear(&mut vars, &format!("{p}/self_attention/linear_0"), 3 * d, d);
                linear(&mut vars, &format!("{p}/self_attention/linear_1"), d, d);
                norm(&mut vars, &format!("{p}/ffn/layer_norm"));
                linear(&mut vars, &format!("{p}/ffn/linear_0"), 4 * d, d);
                linear(&mut vars, &format!("{p}/ffn/linear_1"), d, 4 * d);
                if side == "decoder" {
                    let p = format!("{p}/attention");
                    norm(&mut vars, &format!("{p}/layer_norm"));
                    linear(&mut vars, &format!("{p}/linear_0"), d, d);
                    linear(&mut vars, &format!("{p}/linear_1"), 2 * d, d);
                    linear(&mut vars, &format!("{p}/linear_2"), d, d);
                }
            }
            norm(&mut vars, &format!("{side}/layer_norm"));
        }
        vars
    }
}

/// A model file's bytes in CTranslate2's layout (a Whisper spec):
/// `(name, dims, type id, bytes)` variables and `(alias, target)` pairs.
/// Tests and the speech canary build their tiny models with it.
pub(crate) fn encode_file(
    vars: &[(&str, Vec<u32>, u8, Vec<u8>)],
    aliases: &[(&str, &str)],
) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&((s.len() + 1) as u16).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&BINARY_VERSION.to_le_bytes());
    string(&mut out, "WhisperSpec");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(vars.len() as u32).to_le_bytes());
    for (name, dims, id, data) in vars {
        string(&mut out, name);
        out.push(dims.len() as u8);
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.push(*id);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    }
    out.extend_from_slice(&(aliases.len() as u32).to_le_bytes());
    for (a, t) in aliases {
        string(&mut out, a);
        string(&mut out, t);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) use super::encode_file as write;

    fn f16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect()
    }

    #[test]
    fn reads_variables_scalars_and_aliases() -> Result<(), ModelError> {
        let bytes = write(
            &[
                (
                    "w",
                    vec![2, 3],
                    4,
                    f16_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.5]),
                ),
                ("heads", vec![], 1, vec![6]),
            ],
            &[("w_alias", "w")],
        );
        let f = Ct2File::parse(bytes)?;
        assert_eq!((f.spec.as_str(), f.revision), ("WhisperSpec", 3));
        let t = f.tensor("w_alias", &[2, 3], &Device::Cpu)?;
        assert_eq!(
            t.to_vec2::<f32>()?,
            vec![vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 6.5]]
        );
        assert_eq!(f.scalar("heads")?, 6);
        let err = f
            .tensor("w", &[3, 2], &Device::Cpu)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("expected [3, 2]")));
        Ok(())
    }

    #[test]
    fn refuses_truncated_and_lying_files() {
        let good = write(&[("w", vec![4], 0, vec![0; 16])], &[]);
        // Every cut short of the end is refused, never a panic.
        for cut in 0..good.len() {
            let Err(e) = Ct2File::parse(good[..cut].to_vec()) else {
                // A cut just before the alias count is a file without aliases.
                assert_eq!(cut, good.len() - 4);
                continue;
            };
            assert!(e.to_string().contains("truncated"), "{cut}: {e}");
        }
        // A size that disagrees with the shape.
        let lying = write(&[("w", vec![4], 0, vec![0; 12])], &[]);
        let e = Ct2File::parse(lying).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("needs 16 bytes")));
        // A huge declared size is refused before any allocation.
        let mut huge = write(&[("w", vec![1 << 30, 1 << 30], 0, vec![])], &[]);
        huge.truncate(huge.len() - 4);
        assert!(Ct2File::parse(huge).is_err());
        // Not a model.bin at all.
        let e = Ct2File::parse(b"{\"hello\": 1}".to_vec())
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("binary version")));
        // An alias to nothing.
        let e = Ct2File::parse(write(&[], &[("a", "b")]))
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("not in the file")));
    }
}
