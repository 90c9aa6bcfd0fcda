//! The Llama-family forward (Llama 2/3, Mistral, Qwen2, SmolLM), written once against the
//! `Backend` trait: pre-norm attention with GQA and RoPE over a paged KV cache, then a SwiGLU MLP.

use crate::backend::{AttentionParams, Backend, KvCacheSpec};
use crate::batch::BatchInput;
use crate::config::ModelConfig;
use crate::error::{InferError, Result};
use crate::parallel::{shard_packed, shard_weight, TensorParallel};
use crate::weights::{HostTensor, LayerWeight, WeightName, WeightSource};

struct Layer<T> {
    attn_norm: T,
    wq: T,
    wk: T,
    wv: T,
    /// (q, k, v) biases (Qwen2).
    qkv_bias: Option<(T, T, T)>,
    wo: T,
    ffn_norm: T,
    gate: T,
    up: T,
    down: T,
}

/// Matrices go to the backend packed when it takes them that way; everything else as f32.
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
    let is_matrix = !matches!(
        w,
        WeightName::FinalNorm
            | WeightName::Layer(_, LayerWeight::AttnNorm | LayerWeight::FfnNorm)
            | WeightName::Layer(
                _,
                LayerWeight::QBias | LayerWeight::KBias | LayerWeight::VBias
            )
    );
    if is_matrix {
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

pub struct LlamaModel<B: Backend> {
    config: ModelConfig,
    max_model_len: usize,
    embed: B::Tensor,
    /// `None` when tied to `embed`.
    lm_head: Option<B::Tensor>,
    final_norm: B::Tensor,
    layers: Vec<Layer<B::Tensor>>,
    cos_sin: B::Tensor,
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

impl<B: Backend> LlamaModel<B> {
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
        Ok(LlamaModel { tp, ..model })
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
            let mut per_layer = vec![
                LayerWeight::AttnNorm,
                LayerWeight::Q,
                LayerWeight::K,
                LayerWeight::V,
            ];
            if config.attention_bias {
                per_layer.extend([LayerWeight::QBias, LayerWeight::KBias, LayerWeight::VBias]);
            }
            per_layer.extend([
                LayerWeight::O,
                LayerWeight::FfnNorm,
                LayerWeight::Gate,
                LayerWeight::Up,
                LayerWeight::Down,
            ]);
            names.extend(per_layer.into_iter().map(|w| WeightName::Layer(i, w)));
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
            let mut l = |w| weight(WeightName::Layer(i, w));
            layers.push(Layer {
                attn_norm: l(LayerWeight::AttnNorm)?,
                wq: l(LayerWeight::Q)?,
                wk: l(LayerWeight::K)?,
                wv: l(LayerWeight::V)?,
                qkv_bias: if config.attention_bias {
                    Some((
                        l(LayerWeight::QBias)?,
                        l(LayerWeight::KBias)?,
                        l(LayerWeight::VBias)?,
                    ))
                } else {
                    None
                },
                wo: l(LayerWeight::O)?,
                ffn_norm: l(LayerWeight::FfnNorm)?,
                gate: l(LayerWeight::Gate)?,
                up: l(LayerWeight::Up)?,
                down: l(LayerWeight::Down)?,
            });
        }
        let cos_sin = HostTensor::new(
            vec![max_model_len, config.head_dim],
            config.rope_cos_sin(max_model_len),
        );
        Ok(LlamaModel {
            config: config.clone(),
            max_model_len,
            embed,
            lm_head,
            final_norm,
            layers,
            cos_sin: backend.upload(&cos_sin)?,
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
        let vocab = self.config.vocab_size as u32;
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
        let (meta, x) = self.hidden_states(backend, batch, kv)?;
        let last = backend.gather_logit_rows(&x, &meta)?;
        let c = &self.config;
        let h = backend.rms_norm(&last, &self.final_norm, c.rms_norm_eps)?;
        backend.matmul_logits(&h, self.lm_head.as_ref().unwrap_or(&self.embed))
    }

    /// Every layer of one step, without the logits: the hidden states `[num_tokens, hidden]`
    /// (all a tensor-parallel worker computes; it leaves sampling to rank 0).
    pub fn forward_hidden(
        &self,
        backend: &B,
        batch: &BatchInput,
        kv: &mut B::KvCache,
    ) -> Result<B::Tensor> {
        Ok(self.hidden_states(backend, batch, kv)?.1)
    }

    /// The batch checked and uploaded, and every layer run over it.
    fn hidden_states(
        &self,
        backend: &B,
        batch: &BatchInput,
        kv: &mut B::KvCache,
    ) -> Result<(B::Batch, B::Tensor)> {
        self.check_batch(batch)?;
        let meta = backend.upload_batch(batch)?;
        let x = self.layers_forward(backend, &meta, kv)?;
        Ok((meta, x))
    }

    fn layers_forward(
        &self,
        backend: &B,
        meta: &B::Batch,
        kv: &mut B::KvCache,
    ) -> Result<B::Tensor> {
        let c = &self.config;
        let attn = AttentionParams {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        let mut x = backend.embedding(&self.embed, meta)?;
        for (i, l) in self.layers.iter().enumerate() {
            let h = backend.rms_norm(&x, &l.attn_norm, c.rms_norm_eps)?;
            let [mut q, mut k, mut v] =
                outputs(backend, backend.matmul_many(&h, &[&l.wq, &l.wk, &l.wv])?)?;
            if let Some((bq, bk, bv)) = &l.qkv_bias {
                backend.add_bias(&mut q, bq)?;
                backend.add_bias(&mut k, bk)?;
                backend.add_bias(&mut v, bv)?;
            }
            backend.rope(&mut q, meta, &self.cos_sin, c.head_dim, c.rope_style)?;
            backend.rope(&mut k, meta, &self.cos_sin, c.head_dim, c.rope_style)?;
            backend.write_kv(kv, i, &k, &v, meta)?;
            let a = backend.paged_attention(&q, kv, i, meta, &attn)?;
            let mut o = backend.matmul(&a, &l.wo)?;
            if self.tp.is_parallel() {
                backend.all_reduce_sum(&mut o)?;
            }
            backend.add_assign(&mut x, &o)?;

            let h = backend.rms_norm(&x, &l.ffn_norm, c.rms_norm_eps)?;
            let [gate, up] = outputs(backend, backend.matmul_many(&h, &[&l.gate, &l.up])?)?;
            let act = backend.silu_mul(&gate, &up)?;
            let mut down = backend.matmul(&act, &l.down)?;
            if self.tp.is_parallel() {
                backend.all_reduce_sum(&mut down)?;
            }
            backend.add_assign(&mut x, &down)?;
        }
        Ok(x)
    }
}

/// `matmul_many`'s outputs as an array of the count asked for.
fn outputs<B: Backend, const N: usize>(
    backend: &B,
    outs: Vec<B::Tensor>,
) -> Result<[B::Tensor; N]> {
    let got = outs.len();
    outs.try_into().map_err(|_| InferError::Backend {
        backend: "model",
        message: format!(
            "{}: matmul_many gave {got} outputs for {N} weights",
            backend.name()
        ),
    })
}
