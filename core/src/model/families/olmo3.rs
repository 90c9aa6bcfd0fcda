//! OLMo 3: OLMo 2's block with a sliding window on the layers `layer_types` marks (three of
//! every four by default); sliding layers rotate unscaled (`rope_parameters` per layer type),
//! full ones with the model's scaling (YaRN in the long-context releases). llama.cpp's
//! converter writes it as GGUF arch `olmo2` with window keys, which `olmo2` reads.

use super::olmo2;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::hf::HfConfig;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::RopeStyle;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Olmo3,
    name: "olmo3",
    hf_model_types: &["olmo3"],
    hf_architectures: &["Olmo3ForCausalLM"],
    gguf_archs: &[],
    gguf_rope_style: RopeStyle::HalfSplit,
    hf_keys: &["sliding_window", "layer_types", "rope_local_base_freq"],
    hf_features,
    gguf_features: super::no_gguf_features,
    names: TensorNames::LLAMA,
};

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    olmo2::set(c);
    // transformers defaults the window to 4096 when the config names none.
    c.features.sliding_window = Some(hf.usize("sliding_window")?.unwrap_or(4096));
    c.features.sliding_layers = match hf.sliding_layers(c.num_layers)? {
        Some(layers) => layers,
        None => olmo2::every_fourth_full(c.num_layers),
    };
    let local = hf.rope("sliding_attention", c.head_dim, c.max_position_embeddings)?;
    if local != c.rope {
        c.features.local_rope = Some(local);
    }
    Ok(())
}
