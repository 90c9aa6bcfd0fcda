//! Phi-3 / Phi-4-mini: Llama's block with fused projections (`qkv_proj` rows are q, k, v;
//! `gate_up_proj` rows are gate, up), LongRoPE and partial rotary dimensions (read with the
//! common RoPE keys), and a sliding window on every layer where the config sets one.

use super::hf_window;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::RopeStyle;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Phi3,
    name: "phi3",
    hf_model_types: &["phi3"],
    hf_architectures: &["Phi3ForCausalLM"],
    gguf_archs: &["phi3"],
    gguf_rope_style: RopeStyle::HalfSplit,
    hf_keys: &["sliding_window", "layer_types"],
    hf_features: hf_window,
    gguf_features,
    names: TensorNames {
        hf: &[],
        gguf: &[],
        fused: true,
        hf_layouts: &[],
    },
};

/// The window on every layer, as transformers runs Phi-3 (llama.cpp disables Phi's window).
fn gguf_features(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    super::gguf_window(g, c, None)
}
