//! One `ModelConfig` for every dense decoder family, whichever file format it came from. What
//! sets a family apart from Llama is an explicit feature (`Features`), never a name matched
//! inside the forward: the family files (`model::families`) fill them from config.json or GGUF
//! metadata.

use crate::error::{InferError, Result};
pub use crate::moe::{MoeRouting, MoeScoring};
pub use crate::rope::{Rope, RopeScaling, RopeStyle};

/// Where the per-head query/key RMSNorm of Qwen3, Gemma 3 and OLMo 2 applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// Over each head's `head_dim` values, one weight shared by every head (Qwen3, Gemma 3).
    PerHead,
    /// Over the whole projection, `heads × head_dim` weights (OLMo 2).
    Whole,
}

/// Where a block's RMSNorms sit around attention and the MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NormPlacement {
    /// `x + f(norm(x))` (Llama and most).
    #[default]
    Pre,
    /// `x + norm(f(norm(x)))` (Gemma 2 and 3).
    Sandwich,
    /// `x + norm(f(x))` (OLMo 2).
    Post,
}

/// The gated MLP's activation: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Activation {
    #[default]
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`: Gemma).
    GeluTanh,
    /// gpt-oss: `(clamp(up, ±limit) + 1) · g · σ(alpha · g)` with `g = min(gate, limit)`.
    SwigluClamped { alpha: f32, limit: f32 },
}

/// What a family changes in the Llama block. `Default` is Llama.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Features {
    pub qk_norm: Option<QkNorm>,
    pub norm_placement: NormPlacement,
    /// Added to every stored RMSNorm weight on load: Gemma's HF checkpoints store `w` for a
    /// `(1 + w)` scale (llama.cpp's converter already stores `1 + w`).
    pub norm_weight_offset: f32,
    pub activation: Activation,
    /// Embeddings are multiplied by this (Gemma: √hidden; Granite: `embedding_multiplier`).
    pub embedding_scale: Option<f32>,
    /// Each block's attention and MLP outputs are multiplied by this before the residual add
    /// (Granite's `residual_multiplier`).
    pub residual_scale: Option<f32>,
    /// The softmax scale, when not `1/√head_dim` (Gemma's `query_pre_attn_scalar^-½`,
    /// Granite's `attention_multiplier`).
    pub attention_scale: Option<f32>,
    /// Attention scores become `cap · tanh(s / cap)` (Gemma 2).
    pub attn_logit_softcap: Option<f32>,
    /// Final logits become `cap · tanh(l / cap)` (Gemma 2).
    pub final_logit_softcap: Option<f32>,
    /// Final logits are multiplied by this (Granite: `1 / logits_scaling`).
    pub logits_scale: Option<f32>,
    /// Attention limited to the last `W` positions (the query's own included) on the layers
    /// `sliding_layers` marks.
    pub sliding_window: Option<usize>,
    /// Per layer, whether it slides; empty means every layer does (Mistral).
    pub sliding_layers: Vec<bool>,
    /// The rotary embedding of sliding layers, when it differs (Gemma 3's local θ).
    pub local_rope: Option<Rope>,
    /// Routed experts in place of the dense MLP (on the layers `Moe::sparse_layers` marks).
    pub moe: Option<Moe>,
    /// A learned per-head logit in every attention softmax's denominator (gpt-oss).
    pub attention_sinks: bool,
    /// o_proj carries a bias (gpt-oss).
    pub o_bias: bool,
}

/// A mixture-of-experts MLP: each token runs `routing.top_k` of `routing.num_experts` gated
/// MLPs of width `expert_intermediate_size`, summed with its router's weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Moe {
    pub routing: MoeRouting,
    pub expert_intermediate_size: usize,
    /// Per layer, whether its MLP is routed; empty means every layer (Qwen3-MoE's
    /// `mlp_only_layers` and `decoder_sparse_step` leave some dense).
    pub sparse_layers: Vec<bool>,
    /// The router and every expert projection carry biases (gpt-oss).
    pub biases: bool,
}

/// The families infer runs (`model::registry` has each one's spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Phi3,
    Granite,
    Olmo2,
    Olmo3,
    Qwen3Moe,
    Mixtral,
    GptOss,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family's registry name (`llama`, `qwen3`, `gemma3`, …).
    pub architecture: String,
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    /// The rotary embedding (of full-attention layers, where sliding ones differ).
    pub rope: Rope,
    pub rope_style: RopeStyle,
    /// Longest context the model was trained for.
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Q/K/V projections carry a bias (Qwen2).
    pub attention_bias: bool,
    pub features: Features,
}

/// The longest context a model may declare: 16M tokens (the longest shipped is 10M).
pub const MAX_CONTEXT: usize = 1 << 24;

/// The largest vocabulary a model may have (the largest real ones hold about 2^18 tokens).
pub const MAX_VOCAB: usize = 1 << 22;

impl ModelConfig {
    /// Checks the invariants the forward relies on, so a bad file fails here and not in a kernel.
    /// Every size within what any real model has, so that nothing is allocated from a corrupt
    /// or hostile value (a 2^31 context would size a 512 GiB RoPE table).
    pub fn check_limits(&self) -> Result<()> {
        for (name, v, max) in [
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("hidden_size", self.hidden_size, 1 << 17),
            ("intermediate_size", self.intermediate_size, 1 << 20),
            ("num_layers", self.num_layers, 1 << 12),
            ("num_heads", self.num_heads, 1 << 12),
            ("num_kv_heads", self.num_kv_heads, 1 << 12),
            ("head_dim", self.head_dim, 1 << 12),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_CONTEXT,
            ),
        ] {
            if v > max {
                return Err(InferError::Config(format!(
                    "{name} {v} is beyond any real model's (at most {max}): corrupt or hostile"
                )));
            }
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<()> {
        self.check_limits()?;
        let bad = |m: String| Err(InferError::Config(m));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return bad(format!("{name} is 0"));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "num_heads {} is not a multiple of num_kv_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {} is odd; RoPE needs pairs",
                self.head_dim
            ));
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps < 0.0 {
            return bad(format!("rms_norm_eps {} must be >= 0", self.rms_norm_eps));
        }
        for rope in std::iter::once(&self.rope).chain(&self.features.local_rope) {
            rope.validate()?;
            if rope.rotary_dim > self.head_dim {
                return bad(format!(
                    "rotary dimension {} exceeds head_dim {}",
                    rope.rotary_dim, self.head_dim
                ));
            }
        }
        let f = &self.features;
        if f.sliding_window == Some(0) {
            return bad("sliding_window is 0".into());
        }
        if !f.sliding_layers.is_empty() && f.sliding_layers.len() != self.num_layers {
            return bad(format!(
                "{} layer types for {} layers",
                f.sliding_layers.len(),
                self.num_layers
            ));
        }
        if let Some(moe) = &f.moe {
            moe.routing.validate()?;
            if moe.expert_intermediate_size == 0 {
                return bad("the experts' intermediate size is 0".into());
            }
            if !moe.sparse_layers.is_empty() && moe.sparse_layers.len() != self.num_layers {
                return bad(format!(
                    "{} sparse-layer flags for {} layers",
                    moe.sparse_layers.len(),
                    self.num_layers
                ));
            }
        }
        for (name, v) in [
            ("embedding scale", f.embedding_scale),
            ("residual scale", f.residual_scale),
            ("attention scale", f.attention_scale),
            ("attention logit soft-cap", f.attn_logit_softcap),
            ("final logit soft-cap", f.final_logit_softcap),
            ("logits scale", f.logits_scale),
        ] {
            if v.is_some_and(|v| !v.is_finite() || v <= 0.0) {
                return bad(format!("{name} {v:?} must be a positive number"));
            }
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The window layer `layer` attends within, if it slides.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        let f = &self.features;
        let slides = f.sliding_layers.get(layer).copied().unwrap_or(true);
        f.sliding_window.filter(|_| slides)
    }

    /// The experts of layer `layer`, when its MLP is routed.
    pub fn layer_moe(&self, layer: usize) -> Option<&Moe> {
        self.features
            .moe
            .as_ref()
            .filter(|m| m.sparse_layers.get(layer).copied().unwrap_or(true))
    }

    /// The rotary embedding of layer `layer`.
    pub fn layer_rope(&self, layer: usize) -> &Rope {
        match &self.features.local_rope {
            Some(local) if self.layer_window(layer).is_some() => local,
            _ => &self.rope,
        }
    }

    /// Whether every layer slides, so blocks that left the window can be freed.
    pub fn all_layers_slide(&self) -> bool {
        (0..self.num_layers).all(|l| self.layer_window(l).is_some())
    }
}

/// The shapes unit tests need: a one-layer Llama of `heads` query heads (`kv_heads` KV heads)
/// of `head_dim`, MLP width `ff`, a 64-token vocabulary.
#[cfg(test)]
impl ModelConfig {
    pub(crate) fn test_llama(heads: usize, kv_heads: usize, head_dim: usize, ff: usize) -> Self {
        ModelConfig {
            architecture: "llama".into(),
            family: Family::Llama,
            vocab_size: 64,
            hidden_size: heads * head_dim,
            intermediate_size: ff,
            num_layers: 1,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            rms_norm_eps: 1e-5,
            rope: Rope {
                theta: 10000.0,
                scaling: None,
                rotary_dim: head_dim,
            },
            rope_style: RopeStyle::HalfSplit,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
            attention_bias: false,
            features: Features::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_bad_gqa() {
        let mut c = ModelConfig::test_llama(4, 2, 4, 24);
        c.num_kv_heads = 3;
        assert!(matches!(c.validate(), Err(InferError::Config(m)) if m.contains("multiple")));
    }

    #[test]
    fn sliding_layers_pick_window_and_rope() {
        let mut c = ModelConfig::test_llama(4, 2, 8, 24);
        c.num_layers = 3;
        c.features.sliding_window = Some(4);
        assert!(c.all_layers_slide());
        c.features.sliding_layers = vec![true, false, true];
        c.features.local_rope = Some(Rope {
            theta: 10.0,
            scaling: None,
            rotary_dim: 8,
        });
        c.validate().unwrap();
        assert_eq!(c.layer_window(0), Some(4));
        assert_eq!(c.layer_window(1), None);
        assert_eq!(c.layer_rope(0).theta, 10.0);
        assert_eq!(c.layer_rope(1).theta, 10000.0);
        assert!(!c.all_layers_slide());
    }
}
