//! Gemma 2: sandwich norms (`x + norm(f(norm(x)))`) with `(1 + w)` RMSNorm weights, a
//! GELU-tanh MLP, embeddings scaled by √hidden, softmax scale `query_pre_attn_scalar^-½`,
//! attention and final logits soft-capped (`cap · tanh(x / cap)`), and a sliding window on
//! every other layer (the first slides).

use crate::config::{Activation, ModelConfig, NormPlacement};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::narrow::f32_of;
use crate::rope::RopeStyle;
use crate::weights::LayerWeight;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Gemma2,
    name: "gemma2",
    hf_model_types: &["gemma2"],
    hf_architectures: &["Gemma2ForCausalLM"],
    gguf_archs: &["gemma2"],
    gguf_rope_style: RopeStyle::HalfSplit,
    hf_keys: HF_KEYS,
    hf_features,
    gguf_features,
    names: NAMES,
};

pub(crate) const HF_KEYS: &[&str] = &[
    "hidden_act",
    "hidden_activation",
    "sliding_window",
    "layer_types",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "query_pre_attn_scalar",
];

pub(crate) const NAMES: TensorNames = TensorNames {
    hf: &[(LayerWeight::FfnNorm, "pre_feedforward_layernorm.weight")],
    gguf: &[],
    fused: false,
    hf_layouts: &[],
};

/// What every Gemma shares, from either format. `hf_offset`: HF checkpoints store `w` of the
/// `(1 + w)` norms, llama.cpp's converter `1 + w`.
fn gemma_common(c: &mut ModelConfig, hf_offset: bool) {
    let f = &mut c.features;
    f.norm_placement = NormPlacement::Sandwich;
    f.norm_weight_offset = if hf_offset { 1.0 } else { 0.0 };
    f.activation = Activation::GeluTanh;
    f.embedding_scale = Some((c.hidden_size as f32).sqrt());
}

/// The activation a Gemma config names: only the tanh approximation is what these models
/// were trained with (`gelu_pytorch_tanh`; transformers maps Gemma's plain `gelu` to it too).
fn hf_activation(hf: &HfConfig) -> Result<()> {
    let act = match hf.str("hidden_activation")? {
        Some(a) => Some(a),
        None => hf.str("hidden_act")?,
    };
    match act {
        None | Some("gelu_pytorch_tanh" | "gelu" | "gelu_fast") => Ok(()),
        Some(other) => Err(hf.bad(format!(
            "hidden_activation `{other}` (Gemma runs gelu_pytorch_tanh)"
        ))),
    }
}

/// `query_pre_attn_scalar^-½`, or `1/√head_dim` without one.
fn hf_attention_scale(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    let scalar = hf
        .f64("query_pre_attn_scalar")?
        .unwrap_or(c.head_dim as f64);
    c.features.attention_scale = Some(f32_of(1.0 / scalar.sqrt()));
    Ok(())
}

/// llama.cpp stores no `query_pre_attn_scalar`: like it, take hidden/heads for the 27B shapes
/// (46 layers for Gemma 2, 62 for Gemma 3), whose scalar is that, and `head_dim` otherwise.
fn gguf_attention_scale(c: &mut ModelConfig, big_layers: usize) {
    let scalar = if c.num_layers == big_layers {
        c.hidden_size / c.num_heads
    } else {
        c.head_dim
    };
    c.features.attention_scale = Some(1.0 / (scalar as f32).sqrt());
}

/// Everything a Gemma config.json says (Gemma 3 adds its q/k norms and local RoPE): layers
/// slide as `layer_types` says, or by `default_layers` without it.
pub(crate) fn hf_gemma(
    hf: &HfConfig,
    c: &mut ModelConfig,
    default_layers: fn(usize) -> Vec<bool>,
) -> Result<()> {
    gemma_common(c, true);
    hf_activation(hf)?;
    hf_attention_scale(hf, c)?;
    let f64_f32 = |v: Option<f64>| v.map(f32_of);
    c.features.attn_logit_softcap = f64_f32(hf.f64("attn_logit_softcapping")?);
    c.features.final_logit_softcap = f64_f32(hf.f64("final_logit_softcapping")?);
    c.features.sliding_window = hf.usize("sliding_window")?;
    if c.features.sliding_window.is_some() {
        c.features.sliding_layers = match hf.sliding_layers(c.num_layers)? {
            Some(l) => l,
            None => default_layers(c.num_layers),
        };
    }
    Ok(())
}

/// Everything a Gemma GGUF says: llama.cpp writes no layer pattern, so layers slide by
/// `default_layers` unless the file carries `attention.sliding_window_pattern`.
pub(crate) fn gguf_gemma(
    g: &GgufFile,
    c: &mut ModelConfig,
    big_layers: usize,
    default_layers: fn(usize) -> Vec<bool>,
) -> Result<()> {
    gemma_common(c, false);
    gguf_attention_scale(c, big_layers);
    c.features.attn_logit_softcap = g.arch_f64("attn_logit_softcapping")?.map(f32_of);
    c.features.final_logit_softcap = g.arch_f64("final_logit_softcapping")?.map(f32_of);
    c.features.sliding_window = g.sliding_window()?;
    if c.features.sliding_window.is_some() {
        c.features.sliding_layers = match g.sliding_window_pattern(c.num_layers)? {
            Some(l) => l,
            None => default_layers(c.num_layers),
        };
    }
    Ok(())
}

/// Even layers slide, odd ones attend to everything.
fn alternate(n: usize) -> Vec<bool> {
    (0..n).map(|i| i % 2 == 0).collect()
}

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    hf_gemma(hf, c, alternate)
}

fn gguf_features(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    gguf_gemma(g, c, 46, alternate)
}
