//! Qwen2 / Qwen2.5: Llama's block with biases on the q, k and v projections. Its configs carry
//! a `sliding_window` that only `use_sliding_window: true` switches on (refused: no released
//! Qwen2 uses it).

use crate::config::ModelConfig;
use crate::error::Result;
use crate::hf::HfConfig;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::RopeStyle;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Qwen2,
    name: "qwen2",
    hf_model_types: &["qwen2"],
    hf_architectures: &["Qwen2ForCausalLM"],
    gguf_archs: &["qwen2"],
    gguf_rope_style: RopeStyle::HalfSplit,
    hf_keys: &["use_sliding_window", "sliding_window", "max_window_layers"],
    hf_features,
    gguf_features: super::no_gguf_features,
    names: TensorNames::LLAMA,
};

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    c.attention_bias = true;
    super::hf_qwen_window(hf)
}
