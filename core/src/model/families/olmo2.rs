//! OLMo 2: norms after attention and after the MLP instead of before (`x + norm(f(x))`), and
//! an RMSNorm over the whole query and key projections (not per head) before RoPE. Its GGUF
//! arch is also OLMo 3's (llama.cpp's converter writes both as `olmo2`): a file with a window
//! is read as llama.cpp reads it, OLMo 3's sliding layers rotating unscaled.

use super::{gguf_local_rope, gguf_window, LayerPattern};
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

/// OLMo 3's layers: `i` slides unless it is the last of each group of four (transformers'
/// default, and llama.cpp's for a GGUF without a pattern).
pub(crate) fn every_fourth_full(n: usize) -> Vec<bool> {
    (0..n).map(|i| (i + 1) % 4 != 0).collect()
}

const THREE_SLIDING_TO_ONE_FULL: LayerPattern = LayerPattern {
    describe: "three sliding layers to each full one",
    layers: every_fourth_full,
};

pub(crate) fn set(c: &mut ModelConfig) {
    c.features.norm_placement = NormPlacement::Post;
    c.features.qk_norm = Some(QkNorm::Whole);
}

fn hf_features(_: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    set(c);
    Ok(())
}

fn gguf_features(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    set(c);
    gguf_window(g, c, Some(&THREE_SLIDING_TO_ONE_FULL))?;
    let theta = c.rope.theta;
    gguf_local_rope(g, c, theta, false)
}
