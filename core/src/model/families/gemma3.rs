//! Gemma 3 (text): Gemma 2's block without attention soft-capping, plus a `(1 + w)` RMSNorm
//! over each query and key head, and five sliding layers to each global one; sliding layers
//! rotate with their own θ (`rope_local_base_freq`, 10 000) and no scaling.

use super::gemma2::{self, gemma_common};
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
    gemma_common(c, true);
    c.features.qk_norm = Some(QkNorm::PerHead);
    gemma2::hf_activation(hf)?;
    gemma2::hf_attention_scale(hf, c)?;
    let f64_f32 = |v: Option<f64>| v.map(|x| x as f32);
    c.features.attn_logit_softcap = f64_f32(hf.f64("attn_logit_softcapping")?);
    c.features.final_logit_softcap = f64_f32(hf.f64("final_logit_softcapping")?);
    c.features.sliding_window = hf.usize("sliding_window")?;
    if c.features.sliding_window.is_some() {
        c.features.sliding_layers = match hf.sliding_layers(c.num_layers)? {
            Some(l) => l,
            None => every_sixth_global(c.num_layers),
        };
        let local = hf.rope("sliding_attention", c.head_dim, c.max_position_embeddings)?;
        c.features.local_rope = Some(local);
    }
    Ok(())
}

fn gguf_features(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    gemma_common(c, false);
    c.features.qk_norm = Some(QkNorm::PerHead);
    gemma2::gguf_attention_scale(c, 62);
    c.features.final_logit_softcap = g.arch_f64("final_logit_softcapping")?.map(|x| x as f32);
    c.features.sliding_window = g.sliding_window()?;
    if c.features.sliding_window.is_some() {
        c.features.sliding_layers = match g.sliding_window_pattern(c.num_layers)? {
            Some(l) => l,
            None => every_sixth_global(c.num_layers),
        };
        c.features.local_rope = Some(Rope {
            theta: g.arch_f64("rope.freq_base_swa")?.unwrap_or(10000.0),
            scaling: None,
            rotary_dim: c.rope.rotary_dim,
        });
    }
    Ok(())
}
