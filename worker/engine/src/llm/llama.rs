//! The llama transformer (SmolLM2, Llama 3.x and their kin) over quantized
//! GGUF weights, run on many sequences at once.
//!
//! One forward pass takes any number of sequences, each with its own
//! positions and its own [`KvCache`], and any number of new tokens each (a
//! prompt being read, or one token being generated). Every step that mixes
//! tokens is row-wise (norms, the quantized products, RoPE at the token's own
//! position), and attention runs per sequence over its own cache, so a
//! sequence's logits do not depend on which others share the pass.
//!
//! On the CPU the arithmetic is llama.cpp's own, bit for bit, as its
//! x86-64-v3 build computes it (the build the reference fixtures come
//! from): RoPE angles built and applied the way ggml does, activations
//! quantized per row for the quantized products (Q8_1 or Q8_0), keys,
//! values, queries and attention weights rounded to f16 as its default f16
//! KV cache does, attention sums in its order ([`attention::Order`]), and
//! RMS norm, softmax and SiLU as `kernels::ggml_math` computes them. The
//! same tokens then come out as from llama.cpp. Other devices run candle's
//! ops, close but not the same bits, and so does the CPU on the device path
//! ([`crate::EnginePath::Device`]).

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, IndexOp, Module, Tensor};

use super::attention::{self, Dims, HostKv, SeqPart};
use super::gguf::{GgufFile, LlamaConfig};
use crate::ModelError;
use crate::kernels::{QuantWeight, RmsWeight, in_pool, quant_linear, rms_norm, swiglu};

/// Token embeddings kept as the file stores them (quantized, a few bits a
/// weight); a pass dequantizes only the rows it looks up. Dequantizing is
/// block by block, so a row comes out as it would from the whole table
/// dequantized, at a fraction of the memory (SmolLM2-135M: 16 MB, not 113).
struct Embeddings {
    bytes: Vec<u8>,
    dtype: candle_core::quantized::GgmlDType,
    row_bytes: usize,
    hidden: usize,
}

impl Embeddings {
    fn new(q: &QTensor) -> Result<Self, ModelError> {
        let (vocab, hidden) = q.shape().dims2().map_err(invalid)?;
        let bytes = q.data()?.into_owned();
        if vocab == 0 || bytes.len() % vocab != 0 {
            return Err(invalid(format!(
                "token_embd.weight holds {} bytes for {vocab} rows",
                bytes.len()
            )));
        }
        Ok(Self {
            row_bytes: bytes.len() / vocab,
            bytes,
            dtype: q.dtype(),
            hidden,
        })
    }

    /// The rows of `ids` (checked against the vocabulary before), as f32
    /// `[ids, hidden]`.
    fn rows(&self, ids: &[u32], device: &Device) -> Result<Tensor, ModelError> {
        let mut picked = Vec::with_capacity(ids.len() * self.row_bytes);
        for &id in ids {
            let at = id as usize * self.row_bytes;
            let row = self
                .bytes
                .get(at..at + self.row_bytes)
                .ok_or_else(|| invalid(format!("token id {id} is past the embeddings")))?;
            picked.extend_from_slice(row);
        }
        let storage = candle_core::quantized::QStorage::from_data(
            std::borrow::Cow::Owned(picked),
            device,
            self.dtype,
        )?;
        Ok(QTensor::new(storage, (ids.len(), self.hidden))?.dequantize(device)?)
    }
}

/// A quantized linear layer: our kernel on the CPU for the formats it
/// knows (Q4_1, Q8_0), candle's quantized product otherwise (and on the
/// device path).
enum Linear {
    Own(QuantWeight),
    Candle(QMatMul),
}

impl Linear {
    /// `host`: our CPU kernels run the model ([`crate::EnginePath::host_kernels`]).
    fn new(t: QTensor, host: bool) -> candle_core::Result<Self> {
        if host && let Some(w) = QuantWeight::from_qtensor(&t)? {
            return Ok(Self::Own(w));
        }
        Ok(Self::Candle(QMatMul::from_qtensor(t)?))
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Own(w) => quant_linear(w, x),
            Self::Candle(m) => m.forward(x),
        }
    }
}

/// Products that read the same input (q, k and v; gate and up): on the
/// CPU one stacked weight, so one product and one round of the pool serve
/// all of them with the same values; apart elsewhere, or when their
/// formats differ.
enum Group {
    Stacked { w: QuantWeight, widths: Vec<usize> },
    Apart(Vec<Linear>),
}

impl Group {
    fn new(parts: Vec<QTensor>, host: bool) -> candle_core::Result<Self> {
        let linears = parts
            .into_iter()
            .map(|t| Linear::new(t, host))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let own: Option<Vec<&QuantWeight>> = linears
            .iter()
            .map(|l| match l {
                Linear::Own(w) => Some(w),
                Linear::Candle(_) => None,
            })
            .collect();
        if let Some(own) = own
            && let Some(w) = QuantWeight::stack(&own)
        {
            let widths = own.iter().map(|w| w.n()).collect();
            return Ok(Self::Stacked { w, widths });
        }
        Ok(Self::Apart(linears))
    }

    /// Each part's product of `x`, in the order the parts were given.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Vec<Tensor>> {
        match self {
            Self::Apart(parts) => parts.iter().map(|l| l.forward(x)).collect(),
            Self::Stacked { w, widths } => {
                let y = quant_linear(w, x)?;
                let mut out = Vec::with_capacity(widths.len());
                let mut at = 0;
                for &n in widths {
                    out.push(y.narrow(candle_core::D::Minus1, at, n)?);
                    at += n;
                }
                Ok(out)
            }
        }
    }
}

/// An RMS norm's weights: host values for the CPU's kernel (llama.cpp's
/// arithmetic), a tensor on other devices and on the device path.
enum Norm {
    Host(RmsWeight),
    Device { w: Tensor, eps: f32 },
}

impl Norm {
    fn new(w: Tensor, eps: f32, host: bool) -> candle_core::Result<Self> {
        Ok(if host {
            Self::Host(RmsWeight::new(w.flatten_all()?.to_vec1()?, eps))
        } else {
            Self::Device { w, eps }
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Host(w) => rms_norm(x, w),
            Self::Device { w, eps } => candle_nn::ops::rms_norm(x, w, *eps),
        }
    }
}

/// One transformer block's weights.
struct Block {
    attn_norm: Norm,
    /// q, k and v.
    qkv: Group,
    wo: Linear,
    ffn_norm: Norm,
    /// gate and up.
    gate_up: Group,
    down: Linear,
}

/// A loaded llama model.
pub struct Llama {
    cfg: LlamaConfig,
    device: Device,
    /// Our CPU kernels run it ([`crate::EnginePath::host_kernels`]): host
    /// caches and attention, llama.cpp's arithmetic; otherwise candle's ops.
    host: bool,
    /// Token embeddings (the first stage only).
    embed: Option<Embeddings>,
    /// The first layer held: `blocks` are layers `first..first + len`.
    first: usize,
    blocks: Vec<Block>,
    /// The output norm and head (the last stage only).
    head: Option<(Norm, Linear)>,
    /// RoPE cosines and sines by position: `[context, head_dim / 2]`.
    cos: Tensor,
    sin: Tensor,
    /// The same on the host, for the CPU's attention.
    cos_host: Vec<f32>,
    sin_host: Vec<f32>,
}

/// One sequence's keys and values, per layer `[kv_heads, capacity,
/// head_dim]`, filled up to `len`. Its capacity is fixed when it is made,
/// so what a sequence may take is known before it starts.
pub struct KvCache {
    layers: Vec<LayerKv>,
    len: usize,
    cap: usize,
}

/// One layer's cache: host memory with our CPU kernels (read by our
/// attention kernel), tensors on other devices and on the device path.
enum LayerKv {
    Host(HostKv),
    Device { k: Tensor, v: Tensor },
}

impl KvCache {
    /// Tokens held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens it can hold.
    pub fn capacity(&self) -> usize {
        self.cap
    }
}

/// One sequence's part of a forward pass: its cache and its new tokens.
pub struct Step<'a> {
    /// The sequence's cache; the new tokens are appended to it.
    pub cache: &'a mut KvCache,
    /// The tokens to read, at positions `cache.len()..`.
    pub tokens: &'a [u32],
}

fn invalid(reason: impl std::fmt::Display) -> ModelError {
    ModelError::Invalid {
        family: "llm-generation",
        reason: reason.to_string(),
    }
}

/// A group's `N` products as an array.
fn parts<const N: usize>(v: Vec<Tensor>) -> Result<[Tensor; N], ModelError> {
    let got = v.len();
    v.try_into()
        .map_err(|_| invalid(format!("{got} products where {N} were expected")))
}

/// Rounds to f16 and back, as a value stored in llama.cpp's f16 cache is.
fn f16_round(t: &Tensor) -> candle_core::Result<Tensor> {
    t.to_dtype(DType::F16)?.to_dtype(DType::F32)
}

/// What one stage's pass hands on: the hidden states of every new token
/// `[tokens, hidden]` (f32, to the next stage), or, from the stage that
/// holds the head, the logits [`Llama::forward`] returns.
pub enum StageOut {
    /// Hidden states after this stage's last layer.
    Hidden(Tensor),
    /// Logits.
    Logits(Tensor),
}

impl Llama {
    /// Loads the model in `file` onto `device`, to run the code `path`
    /// names.
    pub fn load(
        file: &mut GgufFile,
        device: &Device,
        path: crate::EnginePath,
    ) -> Result<Self, ModelError> {
        let layers = LlamaConfig::from_gguf(file)?.layers;
        Self::load_stage(file, device, path, 0..layers)
    }

    /// Loads one stage of the model in `file`: the layers `range` only, and
    /// the token embeddings when it starts at 0, the output norm and head
    /// when it ends at the last layer. Only those tensors are read. Stages
    /// over consecutive ranges, each given the one before's
    /// [`StageOut::Hidden`], give the whole model's logits bit for bit.
    pub fn load_stage(
        file: &mut GgufFile,
        device: &Device,
        path: crate::EnginePath,
        range: std::ops::Range<usize>,
    ) -> Result<Self, ModelError> {
        let host = path.host_kernels(device);
        let cfg = LlamaConfig::from_gguf(file)?;
        if range.is_empty() || range.end > cfg.layers {
            return Err(invalid(format!(
                "a stage of layers {}..{} in a model of {} layers",
                range.start, range.end, cfg.layers
            )));
        }
        let embed = if range.start == 0 {
            let embed_q = file.tensor("token_embd.weight", device)?;
            let (vocab, hidden) = embed_q.shape().dims2().map_err(invalid)?;
            if hidden != cfg.hidden || vocab != cfg.vocab {
                return Err(invalid(format!(
                    "token_embd.weight is {vocab} × {hidden}; metadata says {} × {}",
                    cfg.vocab, cfg.hidden
                )));
            }
            Some(Embeddings::new(&embed_q)?)
        } else {
            None
        };
        let eps = cfg.rms_eps as f32;
        let head = if range.end == cfg.layers {
            // Tied: the head is the embeddings' quantized matrix.
            let name = if file.has_tensor("output.weight") {
                "output.weight"
            } else {
                "token_embd.weight"
            };
            let output = Linear::new(file.tensor(name, device)?, host)?;
            let norm = Norm::new(
                file.tensor("output_norm.weight", device)?
                    .dequantize(device)?,
                eps,
                host,
            )?;
            Some((norm, output))
        } else {
            None
        };
        let mut blocks = Vec::with_capacity(range.len());
        for i in range.clone() {
            let mut t = |name: &str| file.tensor(&format!("blk.{i}.{name}.weight"), device);
            let qkv = Group::new(vec![t("attn_q")?, t("attn_k")?, t("attn_v")?], host)?;
            let wo = Linear::new(t("attn_output")?, host)?;
            let gate_up = Group::new(vec![t("ffn_gate")?, t("ffn_up")?], host)?;
            let down = Linear::new(t("ffn_down")?, host)?;
            let attn_norm = Norm::new(
                file.tensor(&format!("blk.{i}.attn_norm.weight"), device)?
                    .dequantize(device)?,
                eps,
                host,
            )?;
            let ffn_norm = Norm::new(
                file.tensor(&format!("blk.{i}.ffn_norm.weight"), device)?
                    .dequantize(device)?,
                eps,
                host,
            )?;
            blocks.push(Block {
                attn_norm,
                qkv,
                wo,
                ffn_norm,
                gate_up,
                down,
            });
        }
        let factors = if file.has_tensor("rope_freqs.weight") {
            let f = file
                .tensor("rope_freqs.weight", device)?
                .dequantize(&Device::Cpu)?;
            Some(f.flatten_all()?.to_vec1::<f32>()?)
        } else {
            None
        };
        let (cos_host, sin_host) = rope_tables(&cfg, factors.as_deref())?;
        let half = cfg.head_dim / 2;
        let cos = Tensor::from_slice(&cos_host, (cfg.context, half), device)?;
        let sin = Tensor::from_slice(&sin_host, (cfg.context, half), device)?;
        Ok(Self {
            cfg,
            device: device.clone(),
            host,
            embed,
            first: range.start,
            blocks,
            head,
            cos,
            sin,
            cos_host,
            sin_host,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The layers this model (or stage) holds.
    pub fn layers(&self) -> std::ops::Range<usize> {
        self.first..self.first + self.blocks.len()
    }

    /// Whether a prompt read in parts (a shared prefix copied, then the
    /// rest) gives the same bits as read whole. Our CPU kernels do (each
    /// row's sums run in the same order whatever the pass holds); candle's
    /// ops do not: its softmax and products sum a row in an order that
    /// depends on the row's length, so a prefix read apart leaves its keys
    /// and values a few bits off, and a record's tokens would depend on its
    /// batch.
    pub fn reads_in_parts_exactly(&self) -> bool {
        self.host
    }

    /// An empty cache for a sequence of at most `tokens` tokens (prompt and
    /// output); refused beyond the model's context.
    pub fn new_cache(&self, tokens: usize) -> Result<KvCache, ModelError> {
        if tokens > self.cfg.context {
            return Err(ModelError::BadInput(format!(
                "{tokens} tokens exceed the model's context of {}",
                self.cfg.context
            )));
        }
        let cap = tokens.max(1);
        let shape = (self.cfg.kv_heads, cap, self.cfg.head_dim);
        let mut layers = Vec::with_capacity(self.blocks.len());
        for _ in 0..self.blocks.len() {
            layers.push(if self.host {
                let n = self.cfg.kv_heads * cap * self.cfg.head_dim;
                LayerKv::Host(HostKv {
                    k: vec![0.0; n],
                    v: vec![0.0; n],
                })
            } else {
                LayerKv::Device {
                    k: Tensor::zeros(shape, DType::F32, &self.device)?,
                    v: Tensor::zeros(shape, DType::F32, &self.device)?,
                }
            });
        }
        Ok(KvCache {
            layers,
            len: 0,
            cap,
        })
    }

    /// Gives the empty cache `to` the first `n` tokens of `from` (a prompt
    /// prefix they share, read once): the same keys and values, bit for
    /// bit, as reading those tokens into `to` in one step of several.
    pub fn copy_prefix(
        &self,
        to: &mut KvCache,
        from: &KvCache,
        n: usize,
    ) -> Result<(), ModelError> {
        if !to.is_empty() || n > from.len || n > to.cap {
            return Err(invalid(format!(
                "a prefix of {n} tokens copied from a cache holding {} into one holding {} of {}",
                from.len, to.len, to.cap
            )));
        }
        let hd = self.cfg.head_dim;
        for (dst, src) in to.layers.iter_mut().zip(&from.layers) {
            match (dst, src) {
                (LayerKv::Host(d), LayerKv::Host(s)) => {
                    for h in 0..self.cfg.kv_heads {
                        let (at, from_at) = (h * to.cap * hd, h * from.cap * hd);
                        d.k[at..at + n * hd].copy_from_slice(&s.k[from_at..from_at + n * hd]);
                        d.v[at..at + n * hd].copy_from_slice(&s.v[from_at..from_at + n * hd]);
                    }
                }
                (LayerKv::Device { k: dk, v: dv }, LayerKv::Device { k: sk, v: sv }) => {
                    dk.slice_set(&sk.narrow(1, 0, n)?.contiguous()?, 1, 0)?;
                    dv.slice_set(&sv.narrow(1, 0, n)?.contiguous()?, 1, 0)?;
                }
                _ => return Err(invalid("a prefix copied between host and device caches")),
            }
        }
        to.len = n;
        Ok(())
    }

    /// Runs one forward pass over `steps`; returns the logits `[sequences,
    /// vocab]` of each sequence's last new token, or with `all` those of
    /// every new token `[tokens, vocab]`, sequences in order.
    pub fn forward(&self, steps: &mut [Step<'_>], all: bool) -> Result<Tensor, ModelError> {
        match self.forward_stage(steps, None, all)? {
            StageOut::Logits(t) => Ok(t),
            StageOut::Hidden(_) => Err(invalid(
                "a forward pass through a stage without the model's head",
            )),
        }
    }

    /// Runs this stage's part of a forward pass over `steps` (each
    /// sequence's cache holds this stage's layers only): from the tokens
    /// when it holds the embeddings, else from `hidden`, the previous
    /// stage's [`StageOut::Hidden`] for the same steps.
    pub fn forward_stage(
        &self,
        steps: &mut [Step<'_>],
        hidden: Option<&Tensor>,
        all: bool,
    ) -> Result<StageOut, ModelError> {
        in_pool(&self.device, || self.forward_here(steps, hidden, all))
    }

    /// [`Llama::forward_stage`] on this thread.
    fn forward_here(
        &self,
        steps: &mut [Step<'_>],
        hidden: Option<&Tensor>,
        all: bool,
    ) -> Result<StageOut, ModelError> {
        let c = &self.cfg;
        let mut ids = Vec::new();
        let mut pos = Vec::new();
        for s in steps.iter() {
            if s.tokens.is_empty() {
                return Err(invalid("a forward step without tokens"));
            }
            if s.cache.layers.len() != self.blocks.len() {
                return Err(invalid(format!(
                    "a cache of {} layers in a pass through {} (made for another stage)",
                    s.cache.layers.len(),
                    self.blocks.len()
                )));
            }
            if s.cache.len + s.tokens.len() > s.cache.cap {
                return Err(ModelError::BadInput(format!(
                    "sequence of {} tokens outgrows its cache of {}",
                    s.cache.len + s.tokens.len(),
                    s.cache.cap
                )));
            }
            ids.extend_from_slice(s.tokens);
            pos.extend((s.cache.len..s.cache.len + s.tokens.len()).map(|p| p as u32));
        }
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(ModelError::BadInput(format!(
                "token id {bad} is outside the vocabulary"
            )));
        }
        let total = ids.len();
        let pos = Tensor::new(pos, &self.device)?;
        let cos = self.cos.index_select(&pos, 0)?;
        let sin = self.sin.index_select(&pos, 0)?;

        let mut x = match (&self.embed, hidden) {
            (Some(embed), None) => embed.rows(&ids, &self.device)?,
            (None, Some(h)) if h.dims() == [total, c.hidden] => h.clone(),
            (None, Some(h)) => {
                return Err(invalid(format!(
                    "hidden states of shape {:?} handed to a stage whose pass has {total} tokens of {}",
                    h.dims(),
                    c.hidden
                )));
            }
            (Some(_), Some(_)) => {
                return Err(invalid("hidden states handed to the first stage"));
            }
            (None, None) => {
                return Err(invalid(
                    "a stage after the first needs the previous stage's hidden states",
                ));
            }
        };
        let host = self.host;
        let positions: Vec<usize> = steps
            .iter()
            .flat_map(|s| s.cache.len..s.cache.len + s.tokens.len())
            .collect();
        for (layer, b) in self.blocks.iter().enumerate() {
            let hn = b.attn_norm.forward(&x)?;
            let [q, k, v] = parts::<3>(b.qkv.forward(&hn)?)?;
            let o = if host {
                self.attend_host(layer, steps, &positions, &q, &k, &v)?
            } else {
                self.attend_device(layer, steps, (&cos, &sin), &q, &k, &v)?
            };
            x = (x + b.wo.forward(&o)?)?;
            let hn = b.ffn_norm.forward(&x)?;
            let [g, u] = parts::<2>(b.gate_up.forward(&hn)?)?;
            let gu = if host {
                swiglu(&g, &u)?
            } else {
                (candle_nn::ops::silu(&g)? * u)?
            };
            x = (&x + b.down.forward(&gu)?)?;
        }
        for s in steps.iter_mut() {
            s.cache.len += s.tokens.len();
        }
        let Some((norm, output)) = &self.head else {
            return Ok(StageOut::Hidden(x));
        };
        let x = if all {
            x
        } else {
            let mut last = Vec::with_capacity(steps.len());
            let mut end = 0u32;
            for s in steps.iter() {
                end += s.tokens.len() as u32;
                last.push(end - 1);
            }
            x.index_select(&Tensor::new(last, &self.device)?, 0)?
        };
        let x = norm.forward(&x)?;
        Ok(StageOut::Logits(output.forward(&x)?))
    }

    /// Attention on the CPU: RoPE and attention on host memory.
    fn attend_host(
        &self,
        layer: usize,
        steps: &mut [Step<'_>],
        positions: &[usize],
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let c = &self.cfg;
        let total = positions.len();
        let mut q: Vec<f32> = q.flatten_all()?.to_vec1()?;
        let mut k: Vec<f32> = k.flatten_all()?.to_vec1()?;
        let v: Vec<f32> = v.flatten_all()?.to_vec1()?;
        self.rope_host(&mut q, c.heads, positions);
        self.rope_host(&mut k, c.kv_heads, positions);
        let mut parts = Vec::with_capacity(steps.len());
        let mut row = 0;
        for s in steps.iter_mut() {
            let n = s.tokens.len();
            let (start, cap) = (s.cache.len, s.cache.cap);
            let LayerKv::Host(kv) = &mut s.cache.layers[layer] else {
                return Err(invalid("a device cache in a CPU pass"));
            };
            parts.push(SeqPart {
                kv,
                cap,
                start,
                n,
                row,
            });
            row += n;
        }
        let dims = Dims {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        let out = attention::attend(&q, &k, &v, &mut parts, dims);
        Ok(Tensor::from_vec(
            out,
            (total, c.heads * c.head_dim),
            &self.device,
        )?)
    }

    /// Rotates pairs `(2i, 2i + 1)` of every head of every row of `x`
    /// (`[rows, heads, head_dim]`) by its row's position, as ggml's RoPE
    /// (normal mode) does in llama.cpp's builds, where the compiler fuses
    /// one product of each sum with the addition: `x0·cos` in the first,
    /// `x0·sin` in the second; the other product is rounded first.
    fn rope_host(&self, x: &mut [f32], heads: usize, positions: &[usize]) {
        let hd = self.cfg.head_dim;
        let half = hd / 2;
        for (r, &p) in positions.iter().enumerate() {
            let cos = &self.cos_host[p * half..][..half];
            let sin = &self.sin_host[p * half..][..half];
            for h in 0..heads {
                let row = &mut x[(r * heads + h) * hd..][..hd];
                for i in 0..half {
                    let (x0, x1) = (row[2 * i], row[2 * i + 1]);
                    row[2 * i] = x0.mul_add(cos[i], -(x1 * sin[i]));
                    row[2 * i + 1] = x0.mul_add(sin[i], x1 * cos[i]);
                }
            }
        }
    }

    /// Attention on a GPU: candle ops per sequence over device caches.
    fn attend_device(
        &self,
        layer: usize,
        steps: &mut [Step<'_>],
        (cos, sin): (&Tensor, &Tensor),
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let c = &self.cfg;
        let total: usize = steps.iter().map(|s| s.tokens.len()).sum();
        let (h, kvh, hd) = (c.heads, c.kv_heads, c.head_dim);
        let group = h / kvh;
        let scale = 1.0 / (hd as f64).sqrt();
        // [1, heads, tokens, head_dim]: every token at its own position.
        let q = q
            .reshape((total, h, hd))?
            .transpose(0, 1)?
            .contiguous()?
            .unsqueeze(0)?;
        let k = k
            .reshape((total, kvh, hd))?
            .transpose(0, 1)?
            .contiguous()?
            .unsqueeze(0)?;
        let q = f16_round(&candle_nn::rotary_emb::rope_i(&q, cos, sin)?.squeeze(0)?)?;
        let k = f16_round(&candle_nn::rotary_emb::rope_i(&k, cos, sin)?.squeeze(0)?)?;
        let v = f16_round(&v.reshape((total, kvh, hd))?.transpose(0, 1)?.contiguous()?)?;
        let mut outs = Vec::with_capacity(steps.len());
        let mut off = 0;
        for s in steps.iter_mut() {
            let n = s.tokens.len();
            let start = s.cache.len;
            let len = start + n;
            let LayerKv::Device { k: ck, v: cv } = &mut s.cache.layers[layer] else {
                return Err(invalid("a host cache in a device pass"));
            };
            ck.slice_set(&k.narrow(1, off, n)?.contiguous()?, 1, start)?;
            cv.slice_set(&v.narrow(1, off, n)?.contiguous()?, 1, start)?;
            let kk = ck.narrow(1, 0, len)?;
            let vv = cv.narrow(1, 0, len)?;
            // Query heads grouped by the key/value head they share.
            let qs = q
                .narrow(1, off, n)?
                .contiguous()?
                .reshape((kvh, group * n, hd))?;
            let att = (qs.matmul(&kk.t()?)? * scale)?;
            let att = if n > 1 {
                let mask = causal_mask(start, n, &self.device)?;
                att.reshape((h, n, len))?.broadcast_add(&mask)?
            } else {
                att.reshape((h, n, len))?
            };
            let att = f16_round(&candle_nn::ops::softmax_last_dim(&att)?)?;
            let o = att
                .reshape((kvh, group * n, len))?
                .matmul(&vv.contiguous()?)?;
            outs.push(
                o.reshape((h, n, hd))?
                    .transpose(0, 1)?
                    .reshape((n, h * hd))?,
            );
            off += n;
        }
        Ok(Tensor::cat(&outs, 0)?)
    }

    /// Logits of every position of `tokens` read as one fresh sequence:
    /// `[tokens, vocab]` (teacher forcing, for perplexity).
    pub fn logits_all(&self, tokens: &[u32]) -> Result<Tensor, ModelError> {
        let mut cache = self.new_cache(tokens.len())?;
        let mut steps = [Step {
            cache: &mut cache,
            tokens,
        }];
        self.forward(&mut steps, true)
    }

    /// One row of a logits tensor as host floats.
    pub fn row(logits: &Tensor, i: usize) -> Result<Vec<f32>, ModelError> {
        Ok(logits.i(i)?.to_dtype(DType::F32)?.to_vec1()?)
    }
}

/// `[n, len]` additive mask for `n` new tokens after `start` cached ones:
/// token `i` sees keys `0..=start + i`.
fn causal_mask(start: usize, n: usize, device: &Device) -> candle_core::Result<Tensor> {
    let len = start + n;
    let mut m = vec![0f32; n * len];
    for i in 0..n {
        for j in start + i + 1..len {
            m[i * len + j] = f32::NEG_INFINITY;
        }
    }
    Tensor::from_vec(m, (n, len), device)?.unsqueeze(0)
}

/// RoPE tables built as ggml builds them: the angle of pair `i` at position
/// `p` is `p · base^(-2i/d)`, the power taken by repeated f32 products, each
/// divided by its frequency factor when the file has them (Llama 3.1+).
fn rope_tables(
    cfg: &LlamaConfig,
    factors: Option<&[f32]>,
) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
    let half = cfg.head_dim / 2;
    if let Some(f) = factors
        && f.len() != half
    {
        return Err(invalid(format!(
            "rope_freqs.weight has {} factors for {half} pairs",
            f.len()
        )));
    }
    let theta_scale = cfg.rope_base.powf(-2.0 / cfg.head_dim as f32);
    let mut cos = Vec::with_capacity(cfg.context * half);
    let mut sin = Vec::with_capacity(cfg.context * half);
    for p in 0..cfg.context {
        let mut theta = p as f32;
        for i in 0..half {
            let t = match factors {
                Some(f) => theta / f[i],
                None => theta,
            };
            cos.push(t.cos());
            sin.push(t.sin());
            theta *= theta_scale;
        }
    }
    Ok((cos, sin))
}

/// The largest logit's index (the first when tied).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// `log softmax(row)[token]`, accumulated in f64.
pub fn log_prob(row: &[f32], token: u32) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let sum: f64 = row.iter().map(|&v| f64::from((v - max).exp())).sum();
    f64::from(row[token as usize] - max) - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_hides_the_future_only() -> candle_core::Result<()> {
        let m = causal_mask(2, 2, &Device::Cpu)?
            .squeeze(0)?
            .to_vec2::<f32>()?;
        assert_eq!(m[0], vec![0.0, 0.0, 0.0, f32::NEG_INFINITY]);
        assert_eq!(m[1], vec![0.0, 0.0, 0.0, 0.0]);
        Ok(())
    }

    #[test]
    fn argmax_and_log_prob() {
        let row = [0.0f32, 2.0, 2.0, -1.0];
        assert_eq!(argmax(&row), 1);
        let total: f64 = (0..4).map(|t| log_prob(&row, t).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
