//! gpt-oss (OpenAI's open-weight MoE): biases on q, k, v and o; a learned per-head sink logit
//! in every attention softmax; sliding windows on every other layer (the even ones); YaRN
//! without truncation; a routed MLP whose router and experts carry biases, top-k over logits
//! then a softmax over those k, and the clamped SwiGLU `(clamp(up, ±7) + 1) · g · σ(1.702 g)`.
//! HF checkpoints store the experts fused and transposed (`gate_up_proj [experts, hidden,
//! 2·ff]`, gate and up interleaved); llama.cpp's converter splits them, and real GGUFs keep
//! them in MXFP4.

use super::{gguf_local_rope, gguf_moe, gguf_window, hf_moe, hf_window, LayerPattern};
use crate::config::{Activation, ModelConfig, MoeScoring};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::model::names::{Layout, TensorNames};
use crate::model::registry::{Family, FamilySpec};
use crate::narrow::f32_of;
use crate::rope::{RopeScaling, RopeStyle};
use crate::weights::LayerWeight;

/// What llama.cpp hard-codes for this architecture (GGUF stores neither).
const ALPHA: f32 = 1.702;
const LIMIT: f32 = 7.0;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::GptOss,
    name: "gpt_oss",
    hf_model_types: &["gpt_oss"],
    hf_architectures: &["GptOssForCausalLM"],
    gguf_archs: &["gpt-oss"],
    gguf_rope_style: RopeStyle::HalfSplit,
    hf_keys: &[
        "attention_bias",
        "sliding_window",
        "layer_types",
        "num_local_experts",
        "num_experts_per_tok",
        "swiglu_alpha",
        "swiglu_limit",
        "quantization_config",
    ],
    hf_features,
    gguf_features,
    names: TensorNames {
        hf: &[
            (LayerWeight::Sinks, "self_attn.sinks"),
            (LayerWeight::Router, "mlp.router.weight"),
            (LayerWeight::RouterBias, "mlp.router.bias"),
            (LayerWeight::ExpGate, "mlp.experts.gate_up_proj"),
            (LayerWeight::ExpUp, "mlp.experts.gate_up_proj"),
            (LayerWeight::ExpDown, "mlp.experts.down_proj"),
            (LayerWeight::ExpGateBias, "mlp.experts.gate_up_proj_bias"),
            (LayerWeight::ExpUpBias, "mlp.experts.gate_up_proj_bias"),
            (LayerWeight::ExpDownBias, "mlp.experts.down_proj_bias"),
        ],
        gguf: &[(LayerWeight::FfnNorm, "post_attention_norm.weight")],
        fused: false,
        hf_layouts: &[
            (LayerWeight::ExpGate, Layout::TransposedInterleaved(0)),
            (LayerWeight::ExpUp, Layout::TransposedInterleaved(1)),
            (LayerWeight::ExpDown, Layout::Transposed),
            (LayerWeight::ExpGateBias, Layout::Interleaved(0)),
            (LayerWeight::ExpUpBias, Layout::Interleaved(1)),
        ],
    },
};

const EVEN_LAYERS_SLIDE: LayerPattern = LayerPattern {
    describe: "the even layers slide",
    layers: |n| (0..n).map(|l| l % 2 == 0).collect(),
};

fn common(c: &mut ModelConfig) {
    c.attention_bias = true;
    c.features.o_bias = true;
    c.features.attention_sinks = true;
}

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    common(c);
    if hf.bool("attention_bias")? == Some(false) {
        return Err(hf.bad("`attention_bias` = false: gpt-oss's projections carry biases"));
    }
    if hf.get("quantization_config").is_some() {
        return Err(hf.bad(
            "quantized safetensors (`quantization_config`, MXFP4 experts) are not read yet: use the model's GGUF, or a checkpoint with dense weights",
        ));
    }
    hf_window(hf, c)?;
    let mut moe = hf_moe(hf, c, "num_local_experts", None, MoeScoring::TopKSoftmax)?;
    moe.biases = true;
    c.features.moe = Some(moe);
    c.features.activation = Activation::SwigluClamped {
        alpha: hf.f64("swiglu_alpha")?.map_or(ALPHA, f32_of),
        limit: hf.f64("swiglu_limit")?.map_or(LIMIT, f32_of),
    };
    Ok(())
}

fn gguf_features(gguf: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    common(c);
    // llama.cpp slides the even layers without a pattern (its period 2), as transformers'
    // `layer_types`; both layer kinds rotate alike unless the file gives sliding ones a θ.
    gguf_window(gguf, c, Some(&EVEN_LAYERS_SLIDE))?;
    let mut moe = gguf_moe(gguf, c, MoeScoring::TopKSoftmax)?;
    moe.biases = true;
    c.features.moe = Some(moe);
    c.features.activation = Activation::SwigluClamped {
        alpha: ALPHA,
        limit: LIMIT,
    };
    // The model was trained with YaRN's ramp untruncated (transformers' `truncate: false`);
    // GGUF has no key for it.
    if let Some(RopeScaling::Yarn { truncate, .. }) = &mut c.rope.scaling {
        *truncate = false;
    }
    let theta = c.rope.theta;
    gguf_local_rope(gguf, c, theta, true)
}
