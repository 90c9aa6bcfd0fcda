//! Gemma 2: sandwich norms (`x + norm(f(norm(x)))`) with `(1 + w)` RMSNorm weights, a
//! GELU-tanh MLP, embeddings scaled by √hidden, softmax scale `query_pre_attn_scalar^-½`,
//! attention and final logits soft-capped (`cap · tanh(x / cap)`), and a sliding window on
//! every other layer (the first slides).

use super::{gguf_local_rope, gguf_sliding_layers, LayerPattern};
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
    for key in ["hidden_activation", "hidden_act"] {
        match hf.str(key)? {
            None | Some("gelu_pytorch_tanh" | "gelu" | "gelu_fast") => {}
            Some(other) => {
                return Err(hf.bad(format!("{key} `{other}` (Gemma runs gelu_pytorch_tanh)")))
            }
        }
    }
    Ok(())
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
fn gguf_attention_scale(g: &GgufFile, c: &mut ModelConfig, big_layers: usize) {
    let (scalar, why) = if c.num_layers == big_layers {
        (
            c.hidden_size / c.num_heads,
            "hidden/heads, this being the 27B shape",
        )
    } else {
        (c.head_dim, "head_dim")
    };
    g.assume(format!(
        "GGUF has no query_pre_attn_scalar: scaling attention by {why} ({scalar})^-1/2, as llama.cpp does"
    ));
    c.features.attention_scale = Some(1.0 / (scalar as f32).sqrt());
}

/// Everything a Gemma config.json says (Gemma 3 adds its q/k norms and local RoPE): layers
/// slide as `layer_types` says, or by `default_layers` without it (which may read the
/// family's older pattern key).
pub(crate) fn hf_gemma(
    hf: &HfConfig,
    c: &mut ModelConfig,
    default_layers: &dyn Fn(usize) -> Result<Vec<bool>>,
) -> Result<()> {
    gemma_common(c, true);
    hf_activation(hf)?;
    hf_attention_scale(hf, c)?;
    let f64_f32 = |v: Option<f64>| v.map(f32_of);
    c.features.attn_logit_softcap = f64_f32(hf.f64("attn_logit_softcapping")?);
    c.features.final_logit_softcap = f64_f32(hf.f64("final_logit_softcapping")?);
    c.features.sliding_window = hf.usize("sliding_window")?;
    let default = default_layers(c.num_layers)?;
    if c.features.sliding_window.is_some() {
        c.features.sliding_layers = hf.sliding_layers(c.num_layers)?.unwrap_or(default);
    }
    Ok(())
}

/// What every Gemma GGUF says: the block, the attention scale, the final soft-cap.
pub(crate) fn gguf_gemma(g: &GgufFile, c: &mut ModelConfig, big_layers: usize) -> Result<()> {
    gemma_common(c, false);
    gguf_attention_scale(g, c, big_layers);
    c.features.final_logit_softcap = g.arch_f64("final_logit_softcapping")?.map(f32_of);
    Ok(())
}

/// A Gemma 2 value llama.cpp assumes when the file lacks it.
fn gemma2_default<T: std::fmt::Display + Copy>(
    g: &GgufFile,
    key: &str,
    read: Option<T>,
    default: T,
) -> T {
    read.unwrap_or_else(|| {
        g.assume(format!(
            "GGUF has no `{}`: taking {default}, Gemma 2's and llama.cpp's default",
            g.arch_key(key)
        ));
        default
    })
}

/// Even layers slide, odd ones attend to everything.
fn alternate(n: usize) -> Vec<bool> {
    (0..n).map(|i| i % 2 == 0).collect()
}

const EVERY_OTHER_LAYER: LayerPattern = LayerPattern {
    describe: "every other layer slides, the first among them",
    layers: alternate,
};

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    hf_gemma(hf, c, &|n| Ok(alternate(n)))
}

/// llama.cpp's reading of a Gemma 2 file: soft-caps of 50 and 30 and a 4096 window where the
/// file is silent (the converter writes all three), every other layer sliding.
fn gguf_features(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    gguf_gemma(g, c, 46)?;
    let attn_cap = g.arch_f64("attn_logit_softcapping")?;
    let attn_cap = gemma2_default(g, "attn_logit_softcapping", attn_cap, 50.0);
    c.features.attn_logit_softcap = Some(f32_of(attn_cap));
    let final_cap = c.features.final_logit_softcap;
    c.features.final_logit_softcap = Some(gemma2_default(
        g,
        "final_logit_softcapping",
        final_cap,
        30.0,
    ));
    let window = g.sliding_window()?;
    c.features.sliding_window = Some(gemma2_default(g, "attention.sliding_window", window, 4096));
    gguf_sliding_layers(g, c, Some(&EVERY_OTHER_LAYER))?;
    let theta = c.rope.theta;
    gguf_local_rope(g, c, theta, true)
}
