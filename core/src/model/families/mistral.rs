//! Mistral: Llama's block with attention over the last `sliding_window` positions on every
//! layer (Mistral 7B v0.1: 4096). The window limits what a query sees, never the context.

use super::hf_window;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::RopeStyle;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Mistral,
    name: "mistral",
    hf_model_types: &["mistral"],
    hf_architectures: &["MistralForCausalLM"],
    // llama.cpp's converter writes Mistral as `llama` (and drops the window); `mistral` is
    // what other writers use.
    gguf_archs: &["mistral"],
    gguf_rope_style: RopeStyle::AdjacentPairs,
    hf_keys: &["sliding_window", "layer_types"],
    hf_features: hf_window,
    gguf_features: super::llama::gguf_features,
    names: TensorNames::LLAMA,
};
