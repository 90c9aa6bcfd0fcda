//! Gemma 3 (text): Gemma 2's block without attention soft-capping, plus a `(1 + w)` RMSNorm
//! over each query and key head, and five sliding layers to each global one; sliding layers
//! rotate with their own θ (`rope_local_base_freq`, 10 000) and no scaling.

use super::{gemma2, gguf_local_rope, gguf_window, LayerPattern};
use crate::config::{ModelConfig, QkNorm};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::RopeStyle;

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
        "sliding_window_pattern",
        "_sliding_window_pattern",
    ],
    hf_features,
    gguf_features,
    names: gemma2::NAMES,
};

/// Layer `i` slides unless it is the last of each group of six.
fn every_sixth_global(n: usize) -> Vec<bool> {
    (0..n).map(|i| (i + 1) % 6 != 0).collect()
}

/// Gemma 3's layers without `layer_types`: transformers ≤ 4.52's period
/// `sliding_window_pattern` (transformers 5 writes it `_sliding_window_pattern` beside
/// `layer_types`, which must then agree), else five sliding to one full.
fn hf_pattern(hf: &HfConfig, n: usize) -> Result<Vec<bool>> {
    let period = match (
        hf.usize("sliding_window_pattern")?,
        hf.usize("_sliding_window_pattern")?,
    ) {
        (Some(a), Some(b)) if a != b => {
            return Err(hf.bad(format!(
                "`sliding_window_pattern` = {a} but `_sliding_window_pattern` = {b}"
            )))
        }
        (Some(p), _) | (None, Some(p)) => Some(p),
        (None, None) => None,
    };
    let Some(p) = period else {
        return Ok(every_sixth_global(n));
    };
    let layers: Vec<bool> = (0..n).map(|i| p == 0 || (i + 1) % p != 0).collect();
    if let Some(types) = hf.sliding_layers(n)? {
        if types != layers {
            return Err(hf.bad(format!(
                "`layer_types` and a sliding window pattern of {p} disagree on which layers slide"
            )));
        }
    }
    Ok(layers)
}

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    gemma2::hf_gemma(hf, c, &|n| hf_pattern(hf, n))?;
    c.features.qk_norm = Some(QkNorm::PerHead);
    if c.features.sliding_window.is_some() {
        let local = hf.rope("sliding_attention", c.head_dim, c.max_position_embeddings)?;
        c.features.local_rope = Some(local);
    }
    Ok(())
}

const FIVE_SLIDING_TO_ONE_FULL: LayerPattern = LayerPattern {
    describe: "five sliding layers to each full one",
    layers: every_sixth_global,
};

/// llama.cpp's reading: no attention soft-cap (its converter asserts there is none), a window
/// only where the file has one, sliding layers unscaled at `rope.freq_base_swa` (10 000).
fn gguf_features(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    gemma2::gguf_gemma(g, c, 62)?;
    c.features.qk_norm = Some(QkNorm::PerHead);
    gguf_window(g, c, Some(&FIVE_SLIDING_TO_ONE_FULL))?;
    gguf_local_rope(g, c, 10000.0, false)
}
