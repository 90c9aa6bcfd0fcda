//! Qwen3: Llama's block with an RMSNorm over each query and key head (one `head_dim` weight
//! shared by the heads) before RoPE, no biases, and a `head_dim` free of hidden/heads.

use crate::config::{ModelConfig, QkNorm};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::RopeStyle;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Qwen3,
    name: "qwen3",
    hf_model_types: &["qwen3"],
    hf_architectures: &["Qwen3ForCausalLM"],
    gguf_archs: &["qwen3"],
    gguf_rope_style: RopeStyle::HalfSplit,
    hf_keys: &["use_sliding_window", "sliding_window", "max_window_layers"],
    hf_features,
    gguf_features,
    names: TensorNames::LLAMA,
};

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    c.features.qk_norm = Some(QkNorm::PerHead);
    super::hf_qwen_window(hf)
}

fn gguf_features(_: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    c.features.qk_norm = Some(QkNorm::PerHead);
    Ok(())
}
