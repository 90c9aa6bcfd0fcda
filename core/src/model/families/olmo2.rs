//! OLMo 2: norms after attention and after the MLP instead of before (`x + norm(f(x))`), and
//! an RMSNorm over the whole query and key projections (not per head) before RoPE.

use crate::config::{ModelConfig, NormPlacement, QkNorm};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::RopeStyle;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Olmo2,
    name: "olmo2",
    hf_model_types: &["olmo2"],
    hf_architectures: &["Olmo2ForCausalLM"],
    gguf_archs: &["olmo2"],
    gguf_rope_style: RopeStyle::HalfSplit,
    hf_keys: &[],
    hf_features,
    gguf_features,
    names: TensorNames::LLAMA,
};

fn set(c: &mut ModelConfig) {
    c.features.norm_placement = NormPlacement::Post;
    c.features.qk_norm = Some(QkNorm::Whole);
}

fn hf_features(_: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    set(c);
    Ok(())
}

fn gguf_features(_: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    set(c);
    Ok(())
}
