//! Whisper's encoder and decoder, loaded from a CTranslate2 model folder
//! and written for batch transcription: many 30-second windows through the
//! encoder at once, their decoders stepped together.
//!
//! The arithmetic is CTranslate2's (the reference engine):
//! - the encoder: two convolutions with GELU, the stored sinusoid table
//!   added, pre-norm layers (attention, then the feed-forward), a final norm;
//! - the decoder: token embeddings plus the stored position table, pre-norm
//!   layers of causal self-attention, attention to the encoder's output and
//!   the feed-forward, a final norm, logits from the tied embeddings;
//! - attention scales the queries by 1/√head_dim (here folded into the
//!   query weights at load), layer norms use ε = 1e-5, GELU is the erf form.
//!
//! On the CPU with our host kernels ([`crate::EnginePath::host_kernels`]),
//! every linear layer is our f32 op over gemm's product with its bias,
//! GELU and residual in the epilogue, the encoder's attention is our
//! packed kernel and layer norms are ours; otherwise candle's ops run the
//! same maths on any device.

use std::path::Path;

use candle_core::{DType, Device, IndexOp, Tensor};

use super::ct2::{Ct2File, FAMILY};
use super::host_attention::{
    KvHost, attend as attend_host, encoder_attention, logits as logits_host,
};
use crate::ModelError;
use crate::kernels::{Activation, DenseWeight, NormParams, dense_linear, layer_norm};

/// Layer norms' ε in Whisper.
const LN_EPS: f32 = 1e-5;

/// The model's sizes, read from the tensors' shapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WhisperDims {
    /// Mel bins of the input (80, or 128 for large-v3).
    pub n_mels: usize,
    /// Width of every layer.
    pub d_model: usize,
    /// Attention heads of the encoder's layers.
    pub encoder_heads: usize,
    /// Attention heads of the decoder's layers.
    pub decoder_heads: usize,
    /// Encoder layers.
    pub encoder_layers: usize,
    /// Decoder layers.
    pub decoder_layers: usize,
    /// Output vocabulary, timestamps included.
    pub vocab: usize,
    /// Encoder positions per window (1500).
    pub audio_ctx: usize,
    /// Decoder positions (448).
    pub text_ctx: usize,
}

impl WhisperDims {
    /// Reads the sizes from a parsed `model.bin`, refusing a file that is
    /// not CTranslate2's Whisper spec or lacks what the sizes come from.
    pub fn read(f: &Ct2File) -> Result<Self, ModelError> {
        if f.spec != "WhisperSpec" {
            return Err(invalid(format!(
                "model.bin holds a {} model, not Whisper",
                f.spec
            )));
        }
        let shape = |name: &str| {
            f.var(name)
                .map(|v| v.dims.clone())
                .ok_or_else(|| invalid(format!("model.bin lacks {name}")))
        };
        let conv1 = shape("encoder/conv1/weight")?;
        let embed_dims = shape("decoder/embeddings/weight")?;
        let audio_pos = shape("encoder/position_encodings/encodings")?;
        let text_pos = shape("decoder/position_encodings/encodings")?;
        let (Some(&d), Some(&n_mels), Some(&vocab), Some(&audio_ctx), Some(&text_ctx)) = (
            conv1.first(),
            conv1.get(1),
            embed_dims.first(),
            audio_pos.first(),
            text_pos.first(),
        ) else {
            return Err(invalid("model.bin has malformed shapes".into()));
        };
        let ld = Loader {
            f,
            dev: &Device::Cpu,
            host: false,
        };
        let dims = Self {
            n_mels,
            d_model: d,
            encoder_heads: ld.heads("encoder/num_heads", d)?,
            decoder_heads: ld.heads("decoder/num_heads", d)?,
            encoder_layers: ld.layers("encoder"),
            decoder_layers: ld.layers("decoder"),
            vocab,
            audio_ctx,
            text_ctx,
        };
        if dims.encoder_layers == 0 || dims.decoder_layers == 0 {
            return Err(invalid("model.bin has no encoder or decoder layers".into()));
        }
        // The encoder halves the mel frames: a window is 2·audio_ctx frames.
        if audio_ctx != 1500 || text_ctx == 0 {
            return Err(invalid(format!(
                "model.bin has {audio_ctx} encoder positions and {text_ctx} decoder positions; Whisper has 1500 and 448"
            )));
        }
        Ok(dims)
    }
}

fn invalid(reason: String) -> ModelError {
    ModelError::Invalid {
        family: FAMILY,
        reason,
    }
}

/// A linear layer: candle's product off the host path, our op on it.
enum Lin {
    /// `(out, in)` weight and bias, for candle's product.
    Candle(Tensor, Tensor),
    /// Our op's weight, which holds the bias.
    Host(DenseWeight),
}

impl Lin {
    fn new(w: Tensor, b: Tensor, host: bool) -> Result<Self, ModelError> {
        Ok(if host {
            Self::Host(DenseWeight::new(&w, &b)?)
        } else {
            Self::Candle(w, b)
        })
    }

    /// `act(x·Wᵀ + b) (+ residual)`; `x` is `(…, in)`.
    fn forward(
        &self,
        x: &Tensor,
        act: Activation,
        residual: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let (w, b) = match self {
            Self::Host(h) => return dense_linear(h, &x.contiguous()?, act, residual, None),
            Self::Candle(w, b) => (w, b),
        };
        let y = x.broadcast_matmul(&w.t()?)?.broadcast_add(b)?;
        let y = match act {
            Activation::Gelu => y.gelu_erf()?,
            Activation::None => y,
        };
        match residual {
            Some(r) => y + r,
            None => Ok(y),
        }
    }
}

/// A layer norm: candle's off the host path, ours on it.
struct Norm {
    gamma: Tensor,
    beta: Tensor,
    host: Option<NormParams>,
}

impl Norm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if let Some(p) = &self.host {
            return layer_norm(&x.contiguous()?, p);
        }
        candle_nn::ops::layer_norm(x, &self.gamma, &self.beta, LN_EPS)
    }
}

/// Reads the tensors of one model folder's `model.bin`.
struct Loader<'a> {
    f: &'a Ct2File,
    dev: &'a Device,
    host: bool,
}

impl Loader<'_> {
    fn t(&self, name: &str, dims: &[usize]) -> Result<Tensor, ModelError> {
        self.f.tensor(name, dims, self.dev)
    }

    fn lin(&self, prefix: &str, out: usize, inp: usize) -> Result<Lin, ModelError> {
        let w = self.t(&format!("{prefix}/weight"), &[out, inp])?;
        let b = self.t(&format!("{prefix}/bias"), &[out])?;
        Lin::new(w, b, self.host)
    }

    /// A fused query-key-value layer (`3d × d`), or a query layer (`d × d`)
    /// when `parts` is 1, its query rows scaled by `scale`.
    fn lin_scaled_q(
        &self,
        prefix: &str,
        d: usize,
        parts: usize,
        scale: f64,
    ) -> Result<Lin, ModelError> {
        let w = self.t(&format!("{prefix}/weight"), &[parts * d, d])?;
        let b = self.t(&format!("{prefix}/bias"), &[parts * d])?;
        let rows = |t: &Tensor, s: usize, n: usize| t.narrow(0, s, n);
        let (w, b) = if parts == 1 {
            ((w * scale)?, (b * scale)?)
        } else {
            let wq = (rows(&w, 0, d)? * scale)?;
            let bq = (rows(&b, 0, d)? * scale)?;
            (
                Tensor::cat(&[&wq, &rows(&w, d, (parts - 1) * d)?], 0)?,
                Tensor::cat(&[&bq, &rows(&b, d, (parts - 1) * d)?], 0)?,
            )
        };
        Lin::new(w, b, self.host)
    }

    fn norm(&self, prefix: &str, d: usize) -> Result<Norm, ModelError> {
        let gamma = self.t(&format!("{prefix}/gamma"), &[d])?;
        let beta = self.t(&format!("{prefix}/beta"), &[d])?;
        let host = if self.host {
            Some(NormParams::new(gamma.to_vec1()?, beta.to_vec1()?, LN_EPS)?)
        } else {
            None
        };
        Ok(Norm { gamma, beta, host })
    }

    fn heads(&self, name: &str, d: usize) -> Result<usize, ModelError> {
        let h = self.f.scalar(name)?;
        if h <= 0 || !d.is_multiple_of(h as usize) {
            return Err(invalid(format!("{name} is {h}, which does not divide {d}")));
        }
        Ok(h as usize)
    }

    /// How many `{side}/layer_N` prefixes the file has.
    fn layers(&self, side: &str) -> usize {
        (0..)
            .take_while(|i| {
                self.f
                    .var(&format!("{side}/layer_{i}/ffn/linear_0/weight"))
                    .is_some()
            })
            .count()
    }
}

/// One encoder layer.
struct EncoderLayer {
    attn_norm: Norm,
    /// Fused query (pre-scaled), key and value.
    qkv: Lin,
    out: Lin,
    ffn_norm: Norm,
    fc1: Lin,
    fc2: Lin,
}

/// One decoder layer.
struct DecoderLayer {
    self_norm: Norm,
    self_qkv: Lin,
    self_out: Lin,
    cross_norm: Norm,
    cross_q: Lin,
    /// Fused key and value over the encoder's output.
    cross_kv: Lin,
    cross_out: Lin,
    ffn_norm: Norm,
    fc1: Lin,
    fc2: Lin,
}

/// A loaded Whisper model.
pub struct Whisper {
    dims: WhisperDims,
    device: Device,
    conv1_w: Tensor,
    conv1_b: Tensor,
    conv2_w: Tensor,
    conv2_b: Tensor,
    /// `(audio_ctx, d)`.
    enc_pos: Tensor,
    enc_layers: Vec<EncoderLayer>,
    enc_norm: Norm,
    /// `(vocab, d)`: token embeddings and the output projection.
    embed: Table,
    /// `(text_ctx, d)`.
    dec_pos: Tensor,
    dec_layers: Vec<DecoderLayer>,
    dec_norm: Norm,
}

/// The decoder's state for a batch of windows: the encoder's keys and
/// values per layer, the self-attention caches and how many positions they
/// hold. Rows are the batch's windows, in the order they were encoded.
pub struct DecodeState {
    /// Per layer, keys and values of the encoder's output, `(rows, heads,
    /// audio_ctx, head_dim)`.
    cross: Vec<(Tensor, Tensor)>,
    /// Per layer, the keys and values of the positions so far.
    cache: Vec<Option<(Tensor, Tensor)>>,
    /// The same on the host, where the steps run there.
    host: Option<HostKv>,
    /// Positions decoded so far.
    pos: usize,
}

/// The embedding table, where the decoder's steps read it: a candle tensor,
/// or plain values when the steps run on the host
/// ([`super::host_attention`]).
enum Table {
    /// `(vocab, d)` on the model's device.
    Candle(Tensor),
    /// `(vocab, d)` row-major on the host.
    Host(Vec<f32>),
}

/// The decoder's keys and values on the host, per layer.
struct HostKv {
    /// Over the encoder's output.
    cross: Vec<KvHost>,
    /// Over the positions so far, room for the whole text context.
    cache: Vec<KvHost>,
}

impl DecodeState {
    /// Positions decoded so far.
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl Whisper {
    /// Loads `dir/model.bin` (CTranslate2's Whisper spec) onto `device`;
    /// `host` selects our CPU kernels. Refuses a file that is not a
    /// Whisper spec or lacks a tensor, saying which.
    pub fn load(dir: &Path, device: &Device, host: bool) -> Result<Self, ModelError> {
        let f = Ct2File::open(&dir.join("model.bin"))?;
        Self::from_file(&f, device, host)
    }

    /// Builds the model from a parsed file.
    pub fn from_file(f: &Ct2File, device: &Device, host: bool) -> Result<Self, ModelError> {
        let dims = WhisperDims::read(f)?;
        let d = dims.d_model;
        let (n_mels, vocab) = (dims.n_mels, dims.vocab);
        let (audio_ctx, text_ctx) = (dims.audio_ctx, dims.text_ctx);
        let ld = Loader {
            f,
            dev: device,
            host,
        };
        let shape = |name: &str| {
            f.var(name)
                .map(|v| v.dims.clone())
                .ok_or_else(|| invalid(format!("model.bin lacks {name}")))
        };
        let ffn = shape("encoder/layer_0/ffn/linear_0/weight")?
            .first()
            .copied()
            .unwrap_or(4 * d);
        let enc_scale = ((d / dims.encoder_heads) as f64).powf(-0.5);
        let dec_scale = ((d / dims.decoder_heads) as f64).powf(-0.5);
        let enc_layers = (0..dims.encoder_layers)
            .map(|i| {
                let p = format!("encoder/layer_{i}");
                Ok(EncoderLayer {
                    attn_norm: ld.norm(&format!("{p}/self_attention/layer_norm"), d)?,
                    qkv: ld.lin_scaled_q(
                        &format!("{p}/self_attention/linear_0"),
                        d,
                        3,
                        enc_scale,
                    )?,
                    out: ld.lin(&format!("{p}/self_attention/linear_1"), d, d)?,
                    ffn_norm: ld.norm(&format!("{p}/ffn/layer_norm"), d)?,
                    fc1: ld.lin(&format!("{p}/ffn/linear_0"), ffn, d)?,
                    fc2: ld.lin(&format!("{p}/ffn/linear_1"), d, ffn)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let dec_layers = (0..dims.decoder_layers)
            .map(|i| {
                let p = format!("decoder/layer_{i}");
                Ok(DecoderLayer {
                    self_norm: ld.norm(&format!("{p}/self_attention/layer_norm"), d)?,
                    self_qkv: ld.lin_scaled_q(
                        &format!("{p}/self_attention/linear_0"),
                        d,
                        3,
                        dec_scale,
                    )?,
                    self_out: ld.lin(&format!("{p}/self_attention/linear_1"), d, d)?,
                    cross_norm: ld.norm(&format!("{p}/attention/layer_norm"), d)?,
                    cross_q: ld.lin_scaled_q(
                        &format!("{p}/attention/linear_0"),
                        d,
                        1,
                        dec_scale,
                    )?,
                    cross_kv: ld.lin(&format!("{p}/attention/linear_1"), 2 * d, d)?,
                    cross_out: ld.lin(&format!("{p}/attention/linear_2"), d, d)?,
                    ffn_norm: ld.norm(&format!("{p}/ffn/layer_norm"), d)?,
                    fc1: ld.lin(&format!("{p}/ffn/linear_0"), ffn, d)?,
                    fc2: ld.lin(&format!("{p}/ffn/linear_1"), d, ffn)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            conv1_w: ld.t("encoder/conv1/weight", &[d, n_mels, 3])?,
            conv1_b: ld.t("encoder/conv1/bias", &[d])?.reshape((1, d, 1))?,
            conv2_w: ld.t("encoder/conv2/weight", &[d, d, 3])?,
            conv2_b: ld.t("encoder/conv2/bias", &[d])?.reshape((1, d, 1))?,
            enc_pos: ld.t("encoder/position_encodings/encodings", &[audio_ctx, d])?,
            enc_norm: ld.norm("encoder/layer_norm", d)?,
            embed: {
                let t = ld.t("decoder/embeddings/weight", &[vocab, d])?;
                if host {
                    Table::Host(t.flatten_all()?.to_vec1()?)
                } else {
                    Table::Candle(t)
                }
            },
            dec_pos: ld.t("decoder/position_encodings/encodings", &[text_ctx, d])?,
            dec_norm: ld.norm("decoder/layer_norm", d)?,
            enc_layers,
            dec_layers,
            dims,
            device: device.clone(),
        })
    }

    /// The model's sizes.
    pub fn dims(&self) -> &WhisperDims {
        &self.dims
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Runs the encoder over `mel`, `(windows, n_mels, 2·audio_ctx)`;
    /// returns `(windows, audio_ctx, d)`.
    pub fn encode(&self, mel: &Tensor) -> Result<Tensor, ModelError> {
        let (b, mels, frames) = mel.dims3()?;
        let ctx = self.dims.audio_ctx;
        if mels != self.dims.n_mels || frames != 2 * ctx {
            return Err(ModelError::BadInput(format!(
                "mel of {mels}×{frames}; this model takes {}×{}",
                self.dims.n_mels,
                2 * ctx
            )));
        }
        let d = self.dims.d_model;
        let x = mel
            .conv1d(&self.conv1_w, 1, 1, 1, 1)?
            .broadcast_add(&self.conv1_b)?
            .gelu_erf()?;
        let x = x
            .conv1d(&self.conv2_w, 1, 2, 1, 1)?
            .broadcast_add(&self.conv2_b)?
            .gelu_erf()?;
        // (b, d, ctx) → (b·ctx, d) rows, position added.
        let mut x = x
            .transpose(1, 2)?
            .broadcast_add(&self.enc_pos)?
            .reshape((b * ctx, d))?
            .contiguous()?;
        let heads = self.dims.encoder_heads;
        for l in &self.enc_layers {
            let h = l.attn_norm.forward(&x)?;
            let qkv = l.qkv.forward(&h, Activation::None, None)?;
            // 1,500 positions a window: blocks of queries against every
            // key, not the packed kernel made for short texts.
            let a = if matches!(self.embed, Table::Host(_)) {
                let a = with_host_f32(&qkv, |v| encoder_attention(v, ctx, heads, d / heads))?;
                Tensor::from_vec(a, (b * ctx, d), &self.device)?
            } else {
                full_attention(&qkv.reshape((b, ctx, 3 * d))?, heads)?.reshape((b * ctx, d))?
            };
            x = l.out.forward(&a, Activation::None, Some(&x))?;
            let h = l.ffn_norm.forward(&x)?;
            let h = l.fc1.forward(&h, Activation::Gelu, None)?;
            x = l.fc2.forward(&h, Activation::None, Some(&x))?;
        }
        Ok(self.enc_norm.forward(&x)?.reshape((b, ctx, d))?)
    }

    /// A decoder state over `encoded` (from [`Self::encode`]): the
    /// encoder's keys and values for every layer, no positions yet.
    pub fn start(&self, encoded: &Tensor) -> Result<DecodeState, ModelError> {
        let (b, ctx, d) = encoded.dims3()?;
        let heads = self.dims.decoder_heads;
        let rows = encoded.reshape((b * ctx, d))?;
        let cross = self
            .dec_layers
            .iter()
            .map(|l| {
                let kv = l.cross_kv.forward(&rows, Activation::None, None)?;
                let kv = kv.reshape((b, ctx, 2, heads, d / heads))?;
                let k = kv.i((.., .., 0))?.transpose(1, 2)?.contiguous()?;
                let v = kv.i((.., .., 1))?.transpose(1, 2)?.contiguous()?;
                Ok((k, v))
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        if matches!(self.embed, Table::Host(_)) {
            let hd = d / heads;
            let host = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
            let cross = cross
                .iter()
                .map(|(k, v)| {
                    Ok(KvHost {
                        k: host(k)?,
                        v: host(v)?,
                        heads,
                        cap: ctx,
                        hd,
                    })
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            let cache = (0..self.dec_layers.len())
                .map(|_| KvHost::new(b, heads, self.dims.text_ctx, hd))
                .collect();
            return Ok(DecodeState {
                cross: Vec::new(),
                cache: Vec::new(),
                host: Some(HostKv { cross, cache }),
                pos: 0,
            });
        }
        Ok(DecodeState {
            cross,
            cache: vec![None; self.dec_layers.len()],
            host: None,
            pos: 0,
        })
    }

    /// Feeds `tokens` (`rows × n`, every row the same length `n`) at the
    /// state's next positions; returns the logits of each row's last
    /// position, `(rows, vocab)`, as f32 on the host.
    pub fn step(
        &self,
        st: &mut DecodeState,
        tokens: &[Vec<u32>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let b = tokens.len();
        let n = tokens.first().map_or(0, Vec::len);
        if n == 0 || tokens.iter().any(|t| t.len() != n) {
            return Err(ModelError::BadInput(
                "decoder step needs rows of one non-zero length".into(),
            ));
        }
        if st.pos + n > self.dims.text_ctx {
            return Err(ModelError::BadInput(format!(
                "decoder positions {}..{} past the model's {}",
                st.pos,
                st.pos + n,
                self.dims.text_ctx
            )));
        }
        let state_rows = match &st.host {
            Some(h) => h.cross.first().map(KvHost::rows),
            None => st.cross.first().and_then(|(k, _)| k.dim(0).ok()),
        };
        if state_rows.is_some_and(|r| r != b) {
            return Err(ModelError::BadInput(format!(
                "{b} token rows for a state of another batch"
            )));
        }
        let d = self.dims.d_model;
        let heads = self.dims.decoder_heads;
        let ids: Vec<u32> = tokens.iter().flatten().copied().collect();
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.dims.vocab) {
            return Err(ModelError::BadInput(format!(
                "token {bad} past the vocabulary"
            )));
        }
        let rows = match &self.embed {
            Table::Host(table) => {
                let mut v = Vec::with_capacity(b * n * d);
                for &t in &ids {
                    v.extend_from_slice(&table[t as usize * d..(t as usize + 1) * d]);
                }
                Tensor::from_vec(v, (b * n, d), &self.device)?
            }
            Table::Candle(e) => e.index_select(&Tensor::from_vec(ids, b * n, &self.device)?, 0)?,
        };
        let pos = self.dec_pos.narrow(0, st.pos, n)?;
        let mut x = rows
            .reshape((b, n, d))?
            .broadcast_add(&pos)?
            .reshape((b * n, d))?
            .contiguous()?;
        if let (Some(hs), Table::Host(table)) = (st.host.as_mut(), &self.embed) {
            let logits = self.step_host(hs, table, st.pos, x, b, n)?;
            st.pos += n;
            return Ok(logits);
        }
        let mask = causal_mask(n, st.pos, &self.device)?;
        for (i, l) in self.dec_layers.iter().enumerate() {
            let h = l.self_norm.forward(&x)?;
            let qkv = l.self_qkv.forward(&h, Activation::None, None)?;
            let qkv = qkv.reshape((b, n, 3, heads, d / heads))?;
            let q = qkv.i((.., .., 0))?.transpose(1, 2)?.contiguous()?;
            let k = qkv.i((.., .., 1))?.transpose(1, 2)?.contiguous()?;
            let v = qkv.i((.., .., 2))?.transpose(1, 2)?.contiguous()?;
            let (k, v) = match st.cache[i].take() {
                Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
                None => (k, v),
            };
            let a = attend(&q, &k, &v, mask.as_ref())?;
            st.cache[i] = Some((k, v));
            x = l
                .self_out
                .forward(&a.reshape((b * n, d))?, Activation::None, Some(&x))?;
            let h = l.cross_norm.forward(&x)?;
            let q = l.cross_q.forward(&h, Activation::None, None)?;
            let q = q
                .reshape((b, n, heads, d / heads))?
                .transpose(1, 2)?
                .contiguous()?;
            let (ck, cv) = &st.cross[i];
            let a = attend(&q, ck, cv, None)?;
            x = l
                .cross_out
                .forward(&a.reshape((b * n, d))?, Activation::None, Some(&x))?;
            let h = l.ffn_norm.forward(&x)?;
            let h = l.fc1.forward(&h, Activation::Gelu, None)?;
            x = l.fc2.forward(&h, Activation::None, Some(&x))?;
        }
        st.pos += n;
        // Only each row's last position needs logits.
        let last = x.reshape((b, n, d))?.i((.., n - 1))?.contiguous()?;
        let last = self.dec_norm.forward(&last)?;
        let Table::Candle(embed) = &self.embed else {
            return Err(ModelError::BadInput(
                "a host model's state on the candle path".into(),
            ));
        };
        let logits = last.matmul(&embed.t()?)?;
        Ok(logits.to_dtype(DType::F32)?.to_vec2()?)
    }

    /// [`Self::step`] on the host: the layers' products through our op,
    /// attention and logits over plain slices.
    fn step_host(
        &self,
        hs: &mut HostKv,
        table: &[f32],
        pos: usize,
        mut x: Tensor,
        b: usize,
        n: usize,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let d = self.dims.d_model;
        let ctx = self.dims.audio_ctx;
        let dev = &self.device;
        let host = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
        for (i, l) in self.dec_layers.iter().enumerate() {
            let h = l.self_norm.forward(&x)?;
            let qkv = host(&l.self_qkv.forward(&h, Activation::None, None)?)?;
            hs.cache[i].append(&qkv, n, pos);
            let a = attend_host(&qkv, 3 * d, n, &hs.cache[i], &|j| pos + j + 1);
            let a = Tensor::from_vec(a, (b * n, d), dev)?;
            x = l.self_out.forward(&a, Activation::None, Some(&x))?;
            let h = l.cross_norm.forward(&x)?;
            let q = host(&l.cross_q.forward(&h, Activation::None, None)?)?;
            let a = attend_host(&q, d, n, &hs.cross[i], &|_| ctx);
            let a = Tensor::from_vec(a, (b * n, d), dev)?;
            x = l.cross_out.forward(&a, Activation::None, Some(&x))?;
            let h = l.ffn_norm.forward(&x)?;
            let h = l.fc1.forward(&h, Activation::Gelu, None)?;
            x = l.fc2.forward(&h, Activation::None, Some(&x))?;
        }
        let last = x.reshape((b, n, d))?.i((.., n - 1))?.contiguous()?;
        let last = host(&self.dec_norm.forward(&last)?)?;
        Ok(logits_host(&last, table, d))
    }

    /// Like [`Self::keep_rows`] for a beam search's reordering: new row
    /// `i` takes row `rows[i]`'s positions, while the encoder's keys and
    /// values stay as they are. Only for `rows` of the state's length where
    /// every row and the one it takes hold the same encoder output (beams
    /// of one window), which saves copying those keys and values each step.
    pub fn reorder_rows(&self, st: &mut DecodeState, rows: &[usize]) -> Result<(), ModelError> {
        if let Some(h) = &mut st.host {
            for kv in &mut h.cache {
                kv.keep(rows);
            }
            return Ok(());
        }
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = Tensor::from_vec(idx, rows.len(), &self.device)?;
        for kv in st.cache.iter_mut().flatten() {
            kv.0 = kv.0.index_select(&idx, 0)?;
            kv.1 = kv.1.index_select(&idx, 0)?;
        }
        Ok(())
    }

    /// Keeps only `rows` (indices into the state's current rows, in the
    /// order given) of a decoder state: finished windows stop costing work.
    pub fn keep_rows(&self, st: &mut DecodeState, rows: &[usize]) -> Result<(), ModelError> {
        if let Some(h) = &mut st.host {
            for kv in h.cross.iter_mut().chain(h.cache.iter_mut()) {
                kv.keep(rows);
            }
            return Ok(());
        }
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx = Tensor::from_vec(idx, rows.len(), &self.device)?;
        let pick = |t: &Tensor| t.index_select(&idx, 0);
        for (k, v) in &mut st.cross {
            *k = pick(k)?;
            *v = pick(v)?;
        }
        for kv in st.cache.iter_mut().flatten() {
            kv.0 = pick(&kv.0)?;
            kv.1 = pick(&kv.1)?;
        }
        Ok(())
    }
}

/// `f` over the values of `t`, an f32 tensor on the CPU, read in place
/// when it is contiguous (a copy otherwise).
fn with_host_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let candle_core::Storage::Cpu(s) = &*storage
            && let Ok(v) = crate::kernels::contiguous_f32("encoder attention", s, layout)
        {
            return Ok(f(v));
        }
    }
    Ok(f(&t.flatten_all()?.to_vec1::<f32>()?))
}

/// The additive causal mask for `n` new positions after `past` cached
/// ones, `(n, past + n)`; none for a single position.
fn causal_mask(n: usize, past: usize, dev: &Device) -> candle_core::Result<Option<Tensor>> {
    if n == 1 {
        return Ok(None);
    }
    let total = past + n;
    let m: Vec<f32> = (0..n)
        .flat_map(|i| (0..total).map(move |j| if j > past + i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(m, (n, total), dev).map(Some)
}

/// Attention of `q` `(b, heads, n, hd)` (queries pre-scaled) over `k`, `v`
/// `(b, heads, t, hd)`; returns `(b, n, heads·hd)`.
fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
) -> candle_core::Result<Tensor> {
    let mut w = q.matmul(&k.t()?)?;
    if let Some(m) = mask {
        w = w.broadcast_add(m)?;
    }
    let w = candle_nn::ops::softmax_last_dim(&w)?;
    let (b, h, n, hd) = q.dims4()?;
    w.matmul(v)?.transpose(1, 2)?.reshape((b, n, h * hd))
}

/// Full (non-causal) self-attention of `(b, t, 3·d)` fused rows, queries
/// pre-scaled; returns `(b, t, d)`.
fn full_attention(qkv: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (b, t, d3) = qkv.dims3()?;
    let d = d3 / 3;
    let qkv = qkv.reshape((b, t, 3, heads, d / heads))?;
    let part = |i: usize| qkv.i((.., .., i))?.transpose(1, 2)?.contiguous();
    attend(&part(0)?, &part(1)?, &part(2)?, None)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::speech::ct2::TinyWhisper;
    use crate::speech::ct2::tests::write;

    /// A random-weight Whisper in CTranslate2's layout: width 8, 2 heads,
    /// one layer each side, 4 mel bins, a vocabulary of 40, 12 positions.
    pub(crate) fn tiny() -> Ct2File {
        let (d, mels, vocab, text) = (8u32, 4u32, 40u32, 12u32);
        let mut seed = 7u32;
        let mut vals = |n: u32| -> Vec<u8> {
            (0..n)
                .flat_map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (((seed >> 16) % 2001) as f32 / 1000.0 - 1.0).to_le_bytes()
                })
                .collect()
        };
        let layout = TinyWhisper {
            width: d,
            mels,
            vocab,
            text_ctx: text,
            audio_ctx: 1500,
            layers: 1,
        };
        let mut vars: Vec<(String, Vec<u32>, u8, Vec<u8>)> = layout
            .variables()
            .into_iter()
            .map(|(name, dims)| {
                let n = dims.iter().product();
                (name, dims, 0, vals(n))
            })
            .collect();
        vars.push(("encoder/num_heads".into(), vec![], 1, vec![2]));
        vars.push(("decoder/num_heads".into(), vec![], 1, vec![2]));
        let refs: Vec<(&str, Vec<u32>, u8, Vec<u8>)> = vars
            .iter()
            .map(|(n, d, t, b)| (n.as_str(), d.clone(), *t, b.clone()))
            .collect();
        let bytes = write(&refs, &[]);
        match Ct2File::parse(bytes) {
            Ok(f) => f,
            Err(e) => panic!("the test model does not parse: {e}"),
        }
    }

    /// Our host kernels and candle's ops (what a GPU runs) give the same
    /// logits, step by step, rows kept and dropped alike.
    #[test]
    fn host_and_device_paths_agree() -> Result<(), ModelError> {
        let f = tiny();
        let dev = Device::Cpu;
        let host = Whisper::from_file(&f, &dev, true)?;
        let plain = Whisper::from_file(&f, &dev, false)?;
        assert_eq!(host.dims().encoder_layers, 1);
        let mel = Tensor::randn(0f32, 1.0, (2, 4, 3000), &dev)?;
        let (eh, ep) = (host.encode(&mel)?, plain.encode(&mel)?);
        let diff = (&eh - &ep)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-4, "encoder outputs differ by {diff}");
        let (mut sh, mut sp) = (host.start(&eh)?, plain.start(&ep)?);
        let close = |a: &[Vec<f32>], b: &[Vec<f32>]| {
            a.iter()
                .flatten()
                .zip(b.iter().flatten())
                .all(|(x, y)| (x - y).abs() < 1e-4)
        };
        let prompt = vec![vec![1, 2, 3]; 2];
        assert!(close(
            &host.step(&mut sh, &prompt)?,
            &plain.step(&mut sp, &prompt)?
        ));
        let next = vec![vec![5], vec![9]];
        assert!(close(
            &host.step(&mut sh, &next)?,
            &plain.step(&mut sp, &next)?
        ));
        host.keep_rows(&mut sh, &[1])?;
        plain.keep_rows(&mut sp, &[1])?;
        let one = vec![vec![11]];
        assert!(close(
            &host.step(&mut sh, &one)?,
            &plain.step(&mut sp, &one)?
        ));
        // A step of the wrong batch, or past the positions, is refused.
        assert!(host.step(&mut sh, &next).is_err());
        assert!(plain.step(&mut sp, &next).is_err());
        assert!(host.step(&mut sh, &[vec![1; 8]]).is_err());
        Ok(())
    }
}
