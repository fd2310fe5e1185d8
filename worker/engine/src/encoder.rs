//! The BERT encoder's forward pass (the all-MiniLM / sentence-transformers
//! family), written for batch inference rather than training.
//!
//! Same weights and arithmetic as the reference (Hugging Face's BertModel
//! in eval mode), arranged to do fewer passes over memory:
//! - query, key and value are one matrix product (their weights stacked at
//!   load), with the 1/√head_dim attention scale folded into the query rows;
//! - weights are stored transposed, so every product reads them row-major;
//! - the states of a padded batch travel packed, real tokens only, through
//!   every layer but attention, so padding costs nothing there (a worker
//!   sorts by length within a shard, whose texts still vary);
//! - in f32 on the CPU, every linear layer is our op over gemm's product
//!   ([`super::kernels::dense_linear`]): the output starts as bias plus
//!   residual, the product adds onto it, GELU or the layer norm follow in
//!   place; off the CPU, candle's product, then the bias and GELU in one
//!   pass of ours ([`super::kernels::bias_gelu`]);
//! - in int8 on an x86-64 CPU, every linear layer is our int8 kernel (on
//!   AVX-512 VNNI, AVX-VNNI, AVX2 or plain Rust, whichever the CPU has),
//!   with its bias, GELU and residual add in the product's epilogue and
//!   the layer norm that follows it on the finished rows; elsewhere int8
//!   is candle's quantized matmul (ggml's Q8_0);
//! - in f16 or bf16 off the CPU, candle's product over half-precision
//!   weights with the activations rounded to the same type, its result
//!   back in f32 for the rest; our CPU kernels have no faster half product
//!   and run both as f32;
//! - on the CPU, attention is our kernel over the packed rows, text by
//!   text ([`super::kernels::packed_attention`]), and layer norm is ours
//!   ([`super::kernels::layer_norm`]); elsewhere attention runs in the
//!   padded layout, its softmax taking the padding mask in the same pass
//!   ([`super::kernels::masked_softmax`]), and layer norm is candle's.
//!
//! "On the CPU" means with our host kernels
//! ([`crate::EnginePath::host_kernels`]): on the device path a CPU runs
//! exactly what a GPU runs.
//!
//! Only absolute position embeddings and token type 0 are supported, which
//! is what sentence embedding models use; [`Encoder::load`] refuses others.

use crate::BertConfig;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor, k_quants::QK8_0};
use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::VarBuilder;

use super::kernels::{
    Activation, DenseWeight, Int8Weight, NormParams, bias_gelu, dense_linear, int8_available,
    int8_ffn, int8_linear, layer_norm, masked_softmax, packed_attention,
};
use minions_schemas::messages::Precision;

/// A linear layer's weight in the form its products read.
enum Weight {
    /// f32, stored `(in, out)`; off the CPU.
    Dense(Tensor),
    /// f16 or bf16, stored `(in, out)`; off the CPU. Activations are
    /// rounded to the weight's type for the product, its result taken back
    /// to f32.
    Half(Tensor),
    /// f32 for our CPU op (gemm's product onto the bias and residual),
    /// which also holds the bias.
    DenseCpu(DenseWeight),
    /// int8 blocks of 32 with one f16 scale each (ggml's Q8_0), stored
    /// `(out, in)`; candle quantises the activations to the same form and
    /// takes integer dot products. Off x86-64 CPUs.
    Int8(QMatMul),
    /// int8 with one scale per output, packed for our kernel, which also
    /// holds the bias. On x86-64 CPUs.
    Int8Cpu(Int8Weight),
}

/// Whether int8 weights use our kernel rather than candle's quantized
/// matmul: with our host kernels (`host`) on a CPU that has one.
fn own_int8(host: bool) -> bool {
    host && int8_available()
}

/// One linear layer.
struct Linear {
    w: Weight,
    b: Tensor,
    /// Our CPU kernels run the steps after the product.
    host: bool,
}

impl Linear {
    /// `w` is `(out, in)`, as checkpoints store it; `host`: our CPU
    /// kernels run it ([`crate::EnginePath::host_kernels`]).
    fn new(w: Tensor, b: Tensor, precision: Precision, host: bool) -> candle_core::Result<Self> {
        let w = match precision {
            // f16 and bf16 never arrive here on our kernels
            // (EnginePath::runs_as).
            Precision::F32 if host => Weight::DenseCpu(DenseWeight::new(&w, &b)?),
            Precision::F32 => Weight::Dense(w.t()?.contiguous()?),
            Precision::F16 => Weight::Half(w.t()?.contiguous()?.to_dtype(DType::F16)?),
            Precision::Bf16 => Weight::Half(w.t()?.contiguous()?.to_dtype(DType::BF16)?),
            Precision::Int8 if own_int8(host) => Weight::Int8Cpu(Int8Weight::new(&w, &b)?),
            Precision::Int8 => Weight::Int8(QMatMul::from_qtensor(QTensor::quantize(
                &w,
                GgmlDType::Q8_0,
            )?)?),
        };
        Ok(Self { w, b, host })
    }

    fn load(
        vb: &VarBuilder<'_>,
        inp: usize,
        out: usize,
        precision: Precision,
        host: bool,
    ) -> candle_core::Result<Self> {
        Self::new(
            vb.get((out, inp), "weight")?,
            vb.get(out, "bias")?,
            precision,
            host,
        )
    }

    /// `act(x · W + b)`, plus `residual` when given, then `norm` when
    /// given. Our int8 kernel does it all in one pass; candle's products
    /// take the bias, GELU, residual and norm in passes after.
    fn apply(
        &self,
        x: &Tensor,
        act: Activation,
        residual: Option<&Tensor>,
        norm: Option<&Norm>,
    ) -> candle_core::Result<Tensor> {
        let y = match &self.w {
            Weight::Int8Cpu(q) => {
                return int8_linear(q, x, act, residual, norm.map(|n| &n.params));
            }
            Weight::DenseCpu(d) => {
                return dense_linear(d, x, act, residual, norm.map(|n| &n.params));
            }
            Weight::Dense(w) => x.matmul(w)?,
            Weight::Half(w) => x.to_dtype(w.dtype())?.matmul(w)?.to_dtype(DType::F32)?,
            Weight::Int8(q) => q.forward(x)?,
        };
        let y = match act {
            Activation::None => y.broadcast_add(&self.b)?,
            Activation::Gelu => bias_gelu(&y, &self.b, self.host)?,
        };
        let y = match residual {
            Some(r) => (y + r)?,
            None => y,
        };
        match norm {
            Some(n) => n.forward(&y),
            None => Ok(y),
        }
    }
}

/// A layer norm: ours with our CPU kernels, candle's op on the device path.
struct Norm {
    w: Tensor,
    b: Tensor,
    eps: f32,
    /// The same weights as plain values, for our kernels.
    params: NormParams,
    host: bool,
}

impl Norm {
    fn load(vb: &VarBuilder<'_>, size: usize, eps: f64, host: bool) -> candle_core::Result<Self> {
        let (w, b) = (vb.get(size, "weight")?, vb.get(size, "bias")?);
        let eps = eps as f32;
        let params = NormParams::new(w.to_vec1()?, b.to_vec1()?, eps)?;
        Ok(Self {
            w,
            b,
            eps,
            params,
            host,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if self.host && x.dtype() == DType::F32 {
            layer_norm(x, &self.params)
        } else {
            candle_nn::ops::layer_norm(&x.contiguous()?, &self.w, &self.b, self.eps)
        }
    }
}

struct Layer {
    qkv: Linear,
    attn_out: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
}

impl Layer {
    fn load(
        vb: VarBuilder<'_>,
        c: &BertConfig,
        head_dim: usize,
        precision: Precision,
        host: bool,
    ) -> candle_core::Result<Self> {
        let h = c.hidden_size;
        let att = vb.pp("attention");
        let sv = att.pp("self");
        let scale = 1.0 / (head_dim as f64).sqrt();
        let q_w = (sv.pp("query").get((h, h), "weight")? * scale)?;
        let q_b = (sv.pp("query").get(h, "bias")? * scale)?;
        let k_w = sv.pp("key").get((h, h), "weight")?;
        let k_b = sv.pp("key").get(h, "bias")?;
        let v_w = sv.pp("value").get((h, h), "weight")?;
        let v_b = sv.pp("value").get(h, "bias")?;
        let qkv = Linear::new(
            Tensor::cat(&[&q_w, &k_w, &v_w], 0)?,
            Tensor::cat(&[&q_b, &k_b, &v_b], 0)?,
            precision,
            host,
        )?;
        let i = c.intermediate_size;
        let eps = c.layer_norm_eps;
        Ok(Self {
            qkv,
            attn_out: Linear::load(&att.pp("output").pp("dense"), h, h, precision, host)?,
            attn_norm: Norm::load(&att.pp("output").pp("LayerNorm"), h, eps, host)?,
            up: Linear::load(&vb.pp("intermediate").pp("dense"), h, i, precision, host)?,
            down: Linear::load(&vb.pp("output").pp("dense"), i, h, precision, host)?,
            out_norm: Norm::load(&vb.pp("output").pp("LayerNorm"), h, eps, host)?,
        })
    }

    /// `x`: the real tokens' states, `(tokens, hidden)`; `p` says where
    /// they sit in the padded batch, which only attention uses.
    fn forward(&self, x: &Tensor, p: &Packing) -> candle_core::Result<Tensor> {
        let qkv = self.qkv.apply(x, Activation::None, None, None)?;
        let ctx = if p.packed_attention {
            packed_attention(&qkv, &p.lens, p.heads)?
        } else {
            p.unpad(&padded_attention(&qkv, p)?)?
        };
        let x = self
            .attn_out
            .apply(&ctx, Activation::None, Some(x), Some(&self.attn_norm))?;
        if let (Weight::Int8Cpu(up), Weight::Int8Cpu(down)) = (&self.up.w, &self.down.w) {
            return int8_ffn(up, down, &x, &self.out_norm.params);
        }
        let up = self.up.apply(&x, Activation::Gelu, None, None)?;
        self.down
            .apply(&up, Activation::None, Some(&x), Some(&self.out_norm))
    }
}

/// Attention in the padded layout, with candle's ops (off the CPU):
/// `qkv` packed `(tokens, 3·hidden)`; returns padded `(batch·len, hidden)`.
fn padded_attention(qkv: &Tensor, p: &Packing) -> candle_core::Result<Tensor> {
    let (batch, len, heads, head_dim) = (p.batch, p.len, p.heads, p.head_dim);
    let qkv = p
        .pad(qkv)?
        .reshape((batch, len, 3, heads, head_dim))?
        .permute((2, 0, 3, 1, 4))?
        .contiguous()?;
    let q = qkv.get(0)?;
    let k = qkv.get(1)?;
    let v = qkv.get(2)?;
    let probs = masked_softmax(&q.matmul(&k.t()?)?, &p.mask_add, p.host)?;
    probs
        .matmul(&v)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((batch * len, heads * head_dim))
}

/// Where a batch's real tokens sit in its padded `(batch, len)` layout.
///
/// Every layer but attention treats tokens alone, so the states travel
/// packed, `(tokens, hidden)`, and padding costs nothing there. Attention
/// on the CPU works on the packed rows text by text ([`packed_attention`]);
/// elsewhere it scatters them into the padded layout and gathers its
/// result back.
struct Packing {
    /// Row of each real token in the padded `batch·len` rows, ascending;
    /// `None` when there is no padding (the layouts coincide).
    rows: Option<Tensor>,
    /// Each text's token count, in batch order.
    lens: Vec<usize>,
    /// Whether attention runs on the packed rows (CPU) rather than in the
    /// padded layout.
    packed_attention: bool,
    /// Our CPU kernels run the padded layout's softmax too.
    host: bool,
    batch: usize,
    len: usize,
    heads: usize,
    head_dim: usize,
    /// `(batch, 1, 1, len)`: 0 for tokens, a large negative number for
    /// padding (exp gives 0).
    mask_add: Tensor,
}

impl Packing {
    /// Packed `(tokens, d)` to padded `(batch·len, d)`, zeros in padding.
    fn pad(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match &self.rows {
            None => Ok(x.clone()),
            Some(rows) => {
                let d = x.dim(1)?;
                Tensor::zeros((self.batch * self.len, d), x.dtype(), x.device())?
                    .index_add(rows, x, 0)
            }
        }
    }

    /// Padded `(batch·len, d)` to packed `(tokens, d)`.
    fn unpad(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match &self.rows {
            None => Ok(x.clone()),
            Some(rows) => x.index_select(rows, 0),
        }
    }
}

/// A loaded BERT encoder.
pub(crate) struct Encoder {
    word: candle_nn::Embedding,
    position: Tensor,
    token_type0: Tensor,
    emb_norm: Norm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
    /// Our CPU kernels run it ([`crate::EnginePath::host_kernels`]): packed
    /// attention, our products and norms; otherwise the device code.
    host: bool,
}

impl Encoder {
    /// Loads the weights under `vb` (with or without a `bert.` prefix), the
    /// layers' linear weights in `precision`, for our CPU kernels (`host`)
    /// or the device code.
    pub(crate) fn load(
        vb: VarBuilder<'_>,
        c: &BertConfig,
        precision: Precision,
        host: bool,
    ) -> Result<Self, String> {
        if c.position_embedding_type != "absolute" {
            return Err(format!(
                "only absolute position embeddings are supported, not {:?}",
                c.position_embedding_type
            ));
        }
        if c.hidden_act != "gelu" {
            return Err(format!(
                "only the erf GELU activation (\"gelu\") is supported, not {:?}",
                c.hidden_act
            ));
        }
        if c.num_attention_heads == 0 || !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(format!(
                "hidden size {} does not split into {} heads",
                c.hidden_size, c.num_attention_heads
            ));
        }
        if precision == Precision::Int8
            && !own_int8(host)
            && !(c.hidden_size.is_multiple_of(QK8_0) && c.intermediate_size.is_multiple_of(QK8_0))
        {
            return Err(format!(
                "int8 needs hidden and intermediate sizes that are multiples of {QK8_0}, not {} and {}",
                c.hidden_size, c.intermediate_size
            ));
        }
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb
        };
        Self::load_tensors(&vb, c, precision, host).map_err(|e| e.to_string())
    }

    fn load_tensors(
        vb: &VarBuilder<'_>,
        c: &BertConfig,
        precision: Precision,
        host: bool,
    ) -> candle_core::Result<Self> {
        let h = c.hidden_size;
        let head_dim = h / c.num_attention_heads;
        let emb = vb.pp("embeddings");
        let word = candle_nn::embedding(c.vocab_size, h, emb.pp("word_embeddings"))?;
        let position = emb
            .pp("position_embeddings")
            .get((c.max_position_embeddings, h), "weight")?;
        let token_type0 = emb
            .pp("token_type_embeddings")
            .get((c.type_vocab_size, h), "weight")?
            .get(0)?;
        let emb_norm = Norm::load(&emb.pp("LayerNorm"), h, c.layer_norm_eps, host)?;
        let enc = vb.pp("encoder");
        let layers = (0..c.num_hidden_layers)
            .map(|i| Layer::load(enc.pp(format!("layer.{i}")), c, head_dim, precision, host))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self {
            word,
            position,
            token_type0,
            emb_norm,
            layers,
            heads: c.num_attention_heads,
            head_dim,
            host,
        })
    }

    /// Token states `(batch, len, hidden)` for `ids` and `mask` (both
    /// `(batch, len)`, u32; mask 1 for tokens, 0 for padding).
    pub(crate) fn forward(&self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        self.run(ids, mask, self.host)
    }

    /// [`Self::forward`], attention packed or padded as asked.
    fn run(
        &self,
        ids: &Tensor,
        mask: &Tensor,
        packed_attention: bool,
    ) -> candle_core::Result<Tensor> {
        let (batch, len) = ids.dims2()?;
        let hidden = self.heads * self.head_dim;
        let device = ids.device();
        // Real tokens: their rows in the padded layout and their positions.
        let (mut rows, mut positions, mut lens) = (Vec::new(), Vec::new(), Vec::new());
        for (b, m) in mask.to_vec2::<u32>()?.iter().enumerate() {
            let before = rows.len();
            for (t, _) in m.iter().enumerate().filter(|(_, m)| **m != 0) {
                rows.push(u32::try_from(b * len + t).map_err(candle_core::Error::wrap)?);
                positions.push(u32::try_from(t).map_err(candle_core::Error::wrap)?);
            }
            lens.push(rows.len() - before);
        }
        let tokens = rows.len();
        if tokens == 0 {
            return Tensor::zeros((batch, len, hidden), DType::F32, device);
        }
        let rows = Tensor::from_vec(rows, tokens, device)?;
        let positions = Tensor::from_vec(positions, tokens, device)?;
        let packed_ids = ids.flatten_all()?.index_select(&rows, 0)?;
        let x = self
            .word
            .forward(&packed_ids)?
            .add(&self.position.index_select(&positions, 0)?)?
            .broadcast_add(&self.token_type0)?;
        let mut x = self.emb_norm.forward(&x)?;
        let p = Packing {
            rows: (tokens < batch * len).then_some(rows),
            lens,
            packed_attention,
            host: self.host,
            batch,
            len,
            heads: self.heads,
            head_dim: self.head_dim,
            mask_add: ((mask.to_dtype(DType::F32)? - 1.0)? * 1e30)?.reshape((batch, 1, 1, len))?,
        };
        for layer in &self.layers {
            x = layer.forward(&x, &p)?;
        }
        p.pad(&x)?.reshape((batch, len, hidden))
    }

    /// The device the weights are on.
    pub(crate) fn device(&self) -> &Device {
        self.position.device()
    }
}

/// Mean of the token states over the mask, then L2-normalised: the
/// sentence-transformers pooling of these models. `(batch, hidden)`.
pub(crate) fn mean_pool_normalise(states: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
    let mask_f = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
    let summed = states.broadcast_mul(&mask_f)?.sum(1)?;
    let counts = mask_f.sum(1)?;
    let mean = summed.broadcast_div(&counts)?;
    let norm = mean.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?.maximum(1e-12)?;
    mean.broadcast_div(&norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_nn::VarMap;

    /// A small encoder's shape.
    fn config(hidden: usize, layers: usize, intermediate: usize, positions: usize) -> BertConfig {
        BertConfig {
            vocab_size: 50,
            hidden_size: hidden,
            num_hidden_layers: layers,
            num_attention_heads: 4,
            intermediate_size: intermediate,
            hidden_act: "gelu".into(),
            max_position_embeddings: positions,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            pad_token_id: 0,
            position_embedding_type: "absolute".into(),
        }
    }

    /// A random 2-layer model on a padded batch: attention packed (the
    /// CPU's) and padded (other devices'), with our kernels, and the device
    /// code throughout give the same pooled vectors; int8 comes close. (The
    /// real model is held to sentence-transformers' vectors in the
    /// integration tests.)
    #[test]
    fn every_layout_and_path_agrees() -> Result<(), Box<dyn std::error::Error>> {
        let dev = Device::Cpu;
        let c = config(32, 2, 64, 16);
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        crate::tiny::declare_bert(&vb, &c)?;
        // Layer norms start at ones and zeros; move them off so a mixed-up
        // weight and bias would show.
        for (name, var) in varmap.data().lock().map_err(|e| e.to_string())?.iter() {
            if name.contains("LayerNorm") {
                let t = var.as_tensor();
                var.set(&(t + Tensor::randn(0f32, 0.1, t.shape(), &dev)?)?)?;
            }
        }
        let ours = Encoder::load(vb.clone(), &c, Precision::F32, true)?;
        let ours_int8 = Encoder::load(vb.clone(), &c, Precision::Int8, true)?;
        let device_path = Encoder::load(vb, &c, Precision::F32, false)?;
        let ids = Tensor::new(&[[2u32, 7, 9, 11, 3, 0], [2, 5, 3, 0, 0, 0]], &dev)?;
        let mask = Tensor::new(&[[1u32, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], &dev)?;
        let a = mean_pool_normalise(&device_path.forward(&ids, &mask)?, &mask)?;
        let runs = [
            ("packed", ours.run(&ids, &mask, true)?),
            ("padded", ours.run(&ids, &mask, false)?),
        ];
        for (what, states) in runs {
            let b = mean_pool_normalise(&states, &mask)?;
            let diff = (&a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff < 1e-5, "{what}: max abs diff {diff}");
        }
        // Padding does not leak: the second text alone, unpadded.
        let alone_ids = Tensor::new(&[[2u32, 5, 3]], &dev)?;
        let alone_mask = alone_ids.ones_like()?;
        let alone = mean_pool_normalise(&ours.forward(&alone_ids, &alone_mask)?, &alone_mask)?;
        let diff = (a.get(1)? - alone.get(0)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(diff < 1e-5, "padding leaked: max abs diff {diff}");

        // int8: close (unit vectors, so the dot product is the cosine), not equal.
        let q = mean_pool_normalise(&ours_int8.forward(&ids, &mask)?, &mask)?;
        let cos = (&a * &q)?.sum(1)?.to_vec1::<f32>()?;
        assert!(cos.iter().all(|&c| c > 0.99), "int8 cosines {cos:?}");
        let diff = (a - q)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff > 1e-6, "int8 output equals f32's");
        Ok(())
    }

    /// candle's int8 needs whole blocks of 32 along every product's inner
    /// dimension, and is refused without them; our kernel takes any size.
    #[test]
    fn int8_sizes_off_the_block() -> Result<(), Box<dyn std::error::Error>> {
        let c = BertConfig {
            type_vocab_size: 1,
            ..config(36, 1, 60, 8)
        };
        let vb = VarBuilder::from_varmap(&VarMap::new(), DType::F32, &Device::Cpu);
        let loaded = Encoder::load(vb, &c, Precision::Int8, true);
        if own_int8(true) {
            let ids = Tensor::new(&[[2u32, 7, 9]], &Device::Cpu)?;
            let out = loaded?.forward(&ids, &ids.ones_like()?)?;
            assert_eq!(out.dims(), &[1, 3, 36]);
        } else {
            let err = loaded.err();
            assert!(
                err.as_deref()
                    .is_some_and(|e| e.contains("multiples of 32")),
                "{err:?}"
            );
        }
        Ok(())
    }
}
