//! Llama 2/3 and SmolLM: the block every other family is described against (pre-norm
//! attention with GQA and RoPE, SwiGLU MLP). Mistral's GGUFs are arch `llama` too, so a
//! sliding window in the metadata is honoured here.

use super::no_hf_features;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::RopeStyle;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Llama,
    name: "llama",
    hf_model_types: &["llama"],
    hf_architectures: &["LlamaForCausalLM"],
    gguf_archs: &["llama"],
    gguf_rope_style: RopeStyle::AdjacentPairs,
    hf_keys: &[],
    hf_features: no_hf_features,
    gguf_features,
    names: TensorNames::LLAMA,
};

/// A window on every layer unless the file names a pattern (llama.cpp's `llama` reads
/// neither key and runs such a file unwindowed; transformers' Mistral slides every layer).
pub(crate) fn gguf_features(gguf: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    super::gguf_window(gguf, c, None)
}
