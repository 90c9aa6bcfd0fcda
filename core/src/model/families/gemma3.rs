//! Gemma 3 (text): Gemma 2's block without attention soft-capping, plus a `(1 + w)` RMSNorm
//! over each query and key head, and five sliding layers to each global one; sliding layers
//! rotate with their own θ (`rope_local_base_freq`, 10 000) and no scaling.

use super::gemma2;
use crate::config::{ModelConfig, QkNorm};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::{Rope, RopeStyle};

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Gemma3,
    name: "gemma3",
    hf_model_types: &["gemma3_text"],
    hf_architectures: &["Gemma3ForCausalLM"],
    gguf_archs: &["gemma3"],
    gguf_rope_style: RopeStyle::HalfSplit,
    hf_keys: &[
        "hidden_act",
        "hidden_activation",
        "sliding_window",
        "layer_types",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "query_pre_attn_scalar",
        "rope_local_base_freq",
    ],
    hf_features,
    gguf_features,
    names: gemma2::NAMES,
};

/// Layer `i` slides unless it is the last of each group of six.
fn every_sixth_global(n: usize) -> Vec<bool> {
    (0..n).map(|i| (i + 1) % 6 != 0).collect()
}

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    gemma2::hf_gemma(hf, c, every_sixth_global)?;
    c.features.qk_norm = Some(QkNorm::PerHead);
    if c.features.sliding_window.is_some() {
        let local = hf.rope("sliding_attention", c.head_dim, c.max_position_embeddings)?;
        c.features.local_rope = Some(local);
    }
    Ok(())
}

fn gguf_features(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    // llama.cpp's Gemma 3 converter asserts there is no attention soft-cap.
    gemma2::gguf_gemma(g, c, 62, every_sixth_global)?;
    c.features.qk_norm = Some(QkNorm::PerHead);
    if c.features.sliding_window.is_some() {
        c.features.local_rope = Some(Rope {
            theta: g.arch_f64("rope.freq_base_swa")?.unwrap_or(10000.0),
            scaling: None,
            rotary_dim: c.rope.rotary_dim,
        });
    }
    Ok(())
}
