//! The decoder forward of every family, written once against the `Backend` trait: attention
//! with GQA and RoPE over a paged KV cache, then a gated MLP or routed experts (`mlp`), with
//! each family's differences taken from `config.features` (norm placement, q/k norms,
//! activation, multipliers, soft-caps, sliding windows, per-layer RoPE, attention sinks,
//! experts) — never from its name.

use super::mlp::{outputs, Mlp};
use crate::backend::{AttentionParams, Backend, KvCacheSpec};
use crate::batch::BatchInput;
use crate::config::{ModelConfig, NormPlacement};
use crate::error::{InferError, Result};
use crate::narrow::u32_index;
use crate::parallel::{shard_packed, shard_weight, TensorParallel};
use crate::weights::{HostTensor, LayerWeight, WeightName, WeightSource};

struct Layer<T> {
    /// `None` where the family norms only after (OLMo 2).
    attn_norm: Option<T>,
    wq: T,
    wk: T,
    wv: T,
    /// (q, k, v) biases (Qwen2).
    qkv_bias: Option<(T, T, T)>,
    /// (q, k) RMSNorm weights (Qwen3, Gemma 3, OLMo 2).
    qk_norm: Option<(T, T)>,
    wo: T,
    /// o_proj's bias, added on rank 0 only (the ranks' partial sums are then reduced).
    o_bias: Option<T>,
    /// Per-head attention sinks (gpt-oss).
    sinks: Option<T>,
    post_attn_norm: Option<T>,
    ffn_norm: Option<T>,
    mlp: Mlp<T>,
    post_ffn_norm: Option<T>,
    /// Index into `Model::rope_tables`.
    rope: usize,
    attention: AttentionParams,
}

/// Matrices go to the backend packed when it takes them that way (or as `upload_matrix`
/// stores them); vectors and routers as f32.
pub fn upload_weight<B: Backend>(
    backend: &B,
    weights: &dyn WeightSource,
    config: &ModelConfig,
    w: WeightName,
) -> Result<B::Tensor> {
    upload_shard(backend, weights, config, &TensorParallel::single(), w)
}

/// `upload_weight` of this rank's slice (`parallel::shard_weight`); `config` is the whole
/// model's.
pub fn upload_shard<B: Backend>(
    backend: &B,
    weights: &dyn WeightSource,
    config: &ModelConfig,
    tp: &TensorParallel,
    w: WeightName,
) -> Result<B::Tensor> {
    // The router stays f32 like the vectors: a top-k choice is discontinuous, and f16 or
    // quantized router weights flip near-tied experts (llama.cpp keeps `ffn_gate_inp` f32).
    let router = matches!(w, WeightName::Layer(_, LayerWeight::Router));
    if !w.is_vector() && !router {
        if let Some(packed) = weights.load_packed(w, config)? {
            let dense = match shard_packed(tp, config, w, packed.clone()) {
                Some(part) => match backend.upload_packed(&part)? {
                    Some(t) => return Ok(t),
                    None => part.dequantize(),
                },
                // Columns cut inside a quant block: this rank's part only exists as f32.
                None => shard_weight(tp, config, w, packed.dequantize()),
            };
            return backend.upload_matrix(&dense);
        }
        return backend.upload_matrix(&shard_weight(tp, config, w, weights.load(w, config)?));
    }
    backend.upload(&shard_weight(tp, config, w, weights.load(w, config)?))
}

/// A loaded model of any supported family on a backend.
pub struct Model<B: Backend> {
    config: ModelConfig,
    max_model_len: usize,
    embed: B::Tensor,
    /// `None` when tied to `embed`.
    lm_head: Option<B::Tensor>,
    final_norm: B::Tensor,
    layers: Vec<Layer<B::Tensor>>,
    /// cos/sin tables `[max_model_len, rotary_dim]`: the model's, then the sliding layers'
    /// where they rotate differently.
    rope_tables: Vec<B::Tensor>,
    /// This rank's place; with more than one rank, `config` holds this rank's heads and
    /// MLP columns and the forward all-reduces o_proj's and down_proj's outputs.
    tp: TensorParallel,
}

/// The context to serve: the model's own, or a smaller one asked for.
pub fn checked_max_model_len(config: &ModelConfig, asked: Option<usize>) -> Result<usize> {
    match asked {
        None => Ok(config.max_position_embeddings),
        Some(0) => Err(InferError::invalid("max_model_len", "must be > 0")),
        Some(n) if n > config.max_position_embeddings => Err(InferError::invalid(
            "max_model_len",
            format!(
                "{n} exceeds the model's context of {}",
                config.max_position_embeddings
            ),
        )),
        Some(n) => Ok(n),
    }
}

/// Load progress: (weights loaded, weights in total).
pub type LoadProgress<'a> = &'a mut dyn FnMut(usize, usize);

impl<B: Backend> Model<B> {
    /// Loads, checks and uploads every weight. `max_model_len` caps the context (and the RoPE
    /// table); it may not exceed the model's own limit.
    pub fn load(
        backend: &B,
        config: &ModelConfig,
        weights: &dyn WeightSource,
        max_model_len: Option<usize>,
        progress: LoadProgress,
    ) -> Result<Self> {
        Self::load_sharded(
            backend,
            config,
            weights,
            max_model_len,
            TensorParallel::single(),
            progress,
        )
    }

    /// `load` of this rank's slice of every weight (`parallel::shard_weight`); a layout
    /// `tp` does not divide is refused before any weight is read.
    pub fn load_sharded(
        backend: &B,
        config: &ModelConfig,
        weights: &dyn WeightSource,
        max_model_len: Option<usize>,
        tp: TensorParallel,
        progress: LoadProgress,
    ) -> Result<Self> {
        config.validate()?;
        tp.check(config)?;
        let local = tp.local_config(config);
        let max_model_len = checked_max_model_len(config, max_model_len)?;
        let has_lm_head = weights.contains(WeightName::LmHead);
        if !has_lm_head && !config.tie_word_embeddings {
            return Err(InferError::MissingTensor {
                name: weights.tensor_name(WeightName::LmHead),
                source_name: weights.source_name(),
            });
        }
        let total = Self::weight_names(config, has_lm_head).len();
        let mut done = 0;
        let model = Self::from_weights(backend, &local, max_model_len, has_lm_head, &mut |w| {
            let t = upload_shard(backend, weights, config, &tp, w)?;
            done += 1;
            progress(done, total);
            Ok(t)
        })?;
        Ok(Model { tp, ..model })
    }

    pub fn tensor_parallel(&self) -> TensorParallel {
        self.tp
    }

    /// Every weight the forward uses, in the order `from_weights` asks for them.
    pub fn weight_names(config: &ModelConfig, has_lm_head: bool) -> Vec<WeightName> {
        let mut names = vec![WeightName::Embed];
        if has_lm_head {
            names.push(WeightName::LmHead);
        }
        names.push(WeightName::FinalNorm);
        for i in 0..config.num_layers {
            names.extend(
                layer_weights(config, i)
                    .into_iter()
                    .map(|w| WeightName::Layer(i, w)),
            );
        }
        names
    }

    /// Builds the model from weights already in backend memory, taken by `weight` in the order
    /// of `weight_names` (the browser uploads them as they stream in). `max_model_len` must
    /// have been checked against the model's limit.
    pub fn from_weights(
        backend: &B,
        config: &ModelConfig,
        max_model_len: usize,
        has_lm_head: bool,
        weight: &mut dyn FnMut(WeightName) -> Result<B::Tensor>,
    ) -> Result<Self> {
        let embed = weight(WeightName::Embed)?;
        let lm_head = if has_lm_head {
            Some(weight(WeightName::LmHead)?)
        } else {
            None
        };
        let final_norm = weight(WeightName::FinalNorm)?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let wanted = layer_weights(config, i);
            // Asked in `layer_weights`' order; weights the family lacks are `None`.
            let mut opt = |w| {
                if wanted.contains(&w) {
                    weight(WeightName::Layer(i, w)).map(Some)
                } else {
                    Ok(None)
                }
            };
            use LayerWeight::*;
            // Q, K, V, O and the MLP are in every plan; the rest where features call for them.
            let need = |t: Option<B::Tensor>, w: LayerWeight| {
                t.ok_or_else(|| InferError::Config(format!("layer {i}: {w:?} is not planned")))
            };
            let attn_norm = opt(AttnNorm)?;
            let wq = need(opt(Q)?, Q)?;
            let wk = need(opt(K)?, K)?;
            let wv = need(opt(V)?, V)?;
            let qkv_bias = match (opt(QBias)?, opt(KBias)?, opt(VBias)?) {
                (Some(q), Some(k), Some(v)) => Some((q, k, v)),
                _ => None,
            };
            let qk_norm = match (opt(QNorm)?, opt(KNorm)?) {
                (Some(q), Some(k)) => Some((q, k)),
                _ => None,
            };
            let wo = need(opt(O)?, O)?;
            let o_bias = opt(OBias)?;
            let sinks = opt(Sinks)?;
            let post_attn_norm = opt(PostAttnNorm)?;
            let ffn_norm = opt(FfnNorm)?;
            let mlp = Mlp::load(config, i, &mut opt)?;
            let post_ffn_norm = opt(PostFfnNorm)?;
            let window = config.layer_window(i);
            let local = window.is_some() && config.features.local_rope.is_some();
            layers.push(Layer {
                attn_norm,
                wq,
                wk,
                wv,
                qkv_bias,
                qk_norm,
                wo,
                o_bias,
                sinks,
                post_attn_norm,
                ffn_norm,
                mlp,
                post_ffn_norm,
                rope: usize::from(local),
                attention: AttentionParams {
                    num_heads: config.num_heads,
                    num_kv_heads: config.num_kv_heads,
                    head_dim: config.head_dim,
                    scale: config
                        .features
                        .attention_scale
                        .unwrap_or(1.0 / (config.head_dim as f32).sqrt()),
                    window,
                    softcap: config.features.attn_logit_softcap,
                },
            });
        }
        let mut rope_tables = Vec::new();
        for rope in std::iter::once(&config.rope).chain(&config.features.local_rope) {
            let table = HostTensor::new(
                vec![max_model_len, rope.rotary_dim],
                rope.cos_sin(max_model_len),
            );
            rope_tables.push(backend.upload(&table)?);
        }
        Ok(Model {
            config: config.clone(),
            max_model_len,
            embed,
            lm_head,
            final_norm,
            layers,
            rope_tables,
            tp: TensorParallel::single(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    pub fn kv_cache_spec(&self, num_blocks: usize, block_size: usize) -> KvCacheSpec {
        KvCacheSpec {
            num_layers: self.config.num_layers,
            num_blocks,
            block_size,
            num_kv_heads: self.config.num_kv_heads,
            head_dim: self.config.head_dim,
        }
    }

    fn check_batch(&self, batch: &BatchInput) -> Result<()> {
        // Within MAX_VOCAB (`ModelConfig::check_limits`).
        let vocab = u32_index(self.config.vocab_size);
        if let Some(t) = batch.token_ids.iter().find(|&&t| t >= vocab) {
            return Err(InferError::invalid(
                "token_ids",
                format!("token id {t} is outside the vocabulary of {vocab}"),
            ));
        }
        if let Some(&ctx) = batch.context_lens.iter().max() {
            if ctx as usize > self.max_model_len {
                return Err(InferError::invalid(
                    "context",
                    format!("{ctx} tokens exceed max_model_len {}", self.max_model_len),
                ));
            }
        }
        Ok(())
    }

    /// Runs one step and returns the logits `[logits_indices.len(), vocab]` in backend memory.
    pub fn forward(
        &self,
        backend: &B,
        batch: &BatchInput,
        kv: &mut B::KvCache,
    ) -> Result<B::Tensor> {
        self.check_batch(batch)?;
        backend.run_step(batch, kv, &mut |meta, kv| {
            let x = self.layers_forward(backend, meta, kv)?;
            let last = backend.gather_logit_rows(&x, meta)?;
            let c = &self.config;
            let h = backend.rms_norm(&last, &self.final_norm, c.rms_norm_eps)?;
            let mut logits =
                backend.matmul_logits(&h, self.lm_head.as_ref().unwrap_or(&self.embed))?;
            if let Some(s) = c.features.logits_scale {
                backend.scale(&mut logits, s)?;
            }
            if let Some(cap) = c.features.final_logit_softcap {
                backend.softcap(&mut logits, cap)?;
            }
            Ok(logits)
        })
    }

    /// The final-normed hidden states of the rows `batch.logits_indices` names, copied to the
    /// host: what a pooling (embedding) model gathers instead of logits. Runs eagerly (no
    /// captured step), as prefill does.
    pub fn forward_normed_rows(
        &self,
        backend: &B,
        batch: &BatchInput,
        kv: &mut B::KvCache,
    ) -> Result<HostTensor> {
        self.check_batch(batch)?;
        let meta = backend.upload_batch(batch)?;
        let x = self.layers_forward(backend, &meta, kv)?;
        let rows = backend.gather_logit_rows(&x, &meta)?;
        let normed = backend.rms_norm(&rows, &self.final_norm, self.config.rms_norm_eps)?;
        backend.to_host(&normed)
    }

    /// Every layer of one step, without the logits: the hidden states `[num_tokens, hidden]`
    /// (all a tensor-parallel worker computes; it leaves sampling to rank 0).
    pub fn forward_hidden(
        &self,
        backend: &B,
        batch: &BatchInput,
        kv: &mut B::KvCache,
    ) -> Result<B::Tensor> {
        self.check_batch(batch)?;
        let meta = backend.upload_batch(batch)?;
        self.layers_forward(backend, &meta, kv)
    }

    fn layers_forward(
        &self,
        backend: &B,
        meta: &B::Batch,
        kv: &mut B::KvCache,
    ) -> Result<B::Tensor> {
        let c = &self.config;
        let eps = c.rms_norm_eps;
        let mut x = backend.embedding(&self.embed, meta)?;
        if let Some(s) = c.features.embedding_scale {
            backend.scale(&mut x, s)?;
        }
        // Each block's opening norm comes with the residual add before it (`add_rms_norm`).
        let mut normed = match self.layers.first().and_then(|l| l.attn_norm.as_ref()) {
            Some(n) => Some(backend.rms_norm(&x, n, eps)?),
            None => None,
        };
        for (i, l) in self.layers.iter().enumerate() {
            let h = normed.as_ref().unwrap_or(&x);
            let [mut q, mut k, mut v] =
                outputs(backend, backend.matmul_many(h, &[&l.wq, &l.wk, &l.wv])?)?;
            if let Some((bq, bk, bv)) = &l.qkv_bias {
                backend.add_bias(&mut q, bq)?;
                backend.add_bias(&mut k, bk)?;
                backend.add_bias(&mut v, bv)?;
            }
            if let Some((nq, nk)) = &l.qk_norm {
                // A `head_dim` weight normalizes each head; a whole-width one the projection.
                q = backend.rms_norm(&q, nq, eps)?;
                k = backend.rms_norm(&k, nk, eps)?;
            }
            let table = &self.rope_tables[l.rope];
            backend.rope(&mut q, meta, table, c.head_dim, c.rope_style)?;
            backend.rope(&mut k, meta, table, c.head_dim, c.rope_style)?;
            backend.write_kv(kv, i, &k, &v, meta)?;
            let a = backend.paged_attention(&q, kv, i, meta, &l.attention, l.sinks.as_ref())?;
            let mut o = backend.matmul(&a, &l.wo)?;
            if let Some(b) = l.o_bias.as_ref().filter(|_| self.tp.rank == 0) {
                backend.add_bias(&mut o, b)?;
            }
            normed = self.residual(
                backend,
                &mut x,
                o,
                l.post_attn_norm.as_ref(),
                l.ffn_norm.as_ref(),
            )?;

            let h = normed.as_ref().unwrap_or(&x);
            let out = l
                .mlp
                .forward(backend, h, c.features.activation, self.tp.rank == 0)?;
            let next_norm = self.layers.get(i + 1).and_then(|n| n.attn_norm.as_ref());
            normed = self.residual(backend, &mut x, out, l.post_ffn_norm.as_ref(), next_norm)?;
        }
        Ok(x)
    }

    /// `x += scale · norm(out)`: a branch's output summed over the ranks (row-parallel
    /// o_proj and down_proj), normed where the family norms after, scaled where it scales.
    /// With `next_norm`, also returns `rms_norm(x)` for the block that follows.
    fn residual(
        &self,
        backend: &B,
        x: &mut B::Tensor,
        mut out: B::Tensor,
        post_norm: Option<&B::Tensor>,
        next_norm: Option<&B::Tensor>,
    ) -> Result<Option<B::Tensor>> {
        let eps = self.config.rms_norm_eps;
        if self.tp.is_parallel() {
            backend.all_reduce_sum(&mut out)?;
        }
        if let Some(n) = post_norm {
            out = backend.rms_norm(&out, n, eps)?;
        }
        if let Some(s) = self.config.features.residual_scale {
            backend.scale(&mut out, s)?;
        }
        match next_norm {
            Some(n) => backend.add_rms_norm(x, &out, n, eps).map(Some),
            None => backend.add_assign(x, &out).map(|()| None),
        }
    }
}

/// The weights layer `layer` of a config's features calls for, in load order.
fn layer_weights(c: &ModelConfig, layer: usize) -> Vec<LayerWeight> {
    use LayerWeight::*;
    let f = &c.features;
    let pre = f.norm_placement != NormPlacement::Post;
    let post = f.norm_placement != NormPlacement::Pre;
    let mut w = Vec::new();
    if pre {
        w.push(AttnNorm);
    }
    w.extend([Q, K, V]);
    if c.attention_bias {
        w.extend([QBias, KBias, VBias]);
    }
    if f.qk_norm.is_some() {
        w.extend([QNorm, KNorm]);
    }
    w.push(O);
    if f.o_bias {
        w.push(OBias);
    }
    if f.attention_sinks {
        w.push(Sinks);
    }
    if post {
        w.push(PostAttnNorm);
    }
    if pre {
        w.push(FfnNorm);
    }
    w.extend(Mlp::<()>::weights(c, layer));
    if post {
        w.push(PostFfnNorm);
    }
    w
}
