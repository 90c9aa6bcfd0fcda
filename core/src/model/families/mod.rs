//! One file per family: how its blocks differ from Llama's, where its config keeps those
//! differences (config.json and GGUF metadata), and the tensor names it does not share.

pub mod gemma2;
pub mod gemma3;
pub mod gpt_oss;
pub mod granite;
pub mod llama;
pub mod mistral;
pub mod mixtral;
pub mod olmo2;
pub mod olmo3;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_moe;

use crate::config::{ModelConfig, Moe, MoeRouting, MoeScoring};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::rope::Rope;

/// For families with nothing beyond the common keys.
pub(crate) fn no_hf_features(_: &HfConfig, _: &mut ModelConfig) -> Result<()> {
    Ok(())
}

pub(crate) fn no_gguf_features(_: &GgufFile, _: &mut ModelConfig) -> Result<()> {
    Ok(())
}

/// The sliding window of a config.json, on the layers `layer_types` marks (all when absent).
pub(crate) fn hf_window(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    c.features.sliding_window = hf.usize("sliding_window")?;
    if c.features.sliding_window.is_some() {
        c.features.sliding_layers = hf.sliding_layers(c.num_layers)?.unwrap_or_default();
    }
    Ok(())
}

/// Qwen's window: configs carry a `sliding_window` (and `max_window_layers`) that only
/// `use_sliding_window: true` switches on; no released Qwen does, and infer refuses it.
pub(crate) fn hf_qwen_window(hf: &HfConfig) -> Result<()> {
    if hf.bool("use_sliding_window")? == Some(true) {
        return Err(hf.bad(
            "`use_sliding_window` = true: Qwen's sliding window is not supported (no released Qwen model uses it)",
        ));
    }
    // Off: the window's size and layer count change nothing.
    hf.get("sliding_window");
    hf.get("max_window_layers");
    Ok(())
}

/// A config.json's experts: `experts_key` experts, `num_experts_per_tok` of them per token,
/// each `ff_key` wide (absent: `intermediate_size`).
pub(crate) fn hf_moe(
    hf: &HfConfig,
    c: &ModelConfig,
    experts_key: &str,
    ff_key: Option<&str>,
    scoring: MoeScoring,
) -> Result<Moe> {
    let expert_intermediate_size = match ff_key {
        Some(k) => hf.require_usize(k)?,
        None => c.intermediate_size,
    };
    Ok(Moe {
        routing: MoeRouting {
            num_experts: hf.require_usize(experts_key)?,
            top_k: hf.require_usize("num_experts_per_tok")?,
            scoring,
        },
        expert_intermediate_size,
        sparse_layers: Vec::new(),
        biases: false,
    })
}

/// Which layers slide when a GGUF says nothing: llama.cpp's assumption for the architecture,
/// said once at load.
pub(crate) struct LayerPattern {
    pub describe: &'static str,
    pub layers: fn(usize) -> Vec<bool>,
}

/// A GGUF's window (`attention.sliding_window`, 0 or absent: none) and the layers it covers
/// (`attention.sliding_window_pattern`; without one `default`, or every layer when `None`).
pub(crate) fn gguf_window(
    g: &GgufFile,
    c: &mut ModelConfig,
    default: Option<&LayerPattern>,
) -> Result<()> {
    c.features.sliding_window = g.sliding_window()?;
    gguf_sliding_layers(g, c, default)
}

/// The layers a GGUF's window covers (the window already set): the file's pattern, or
/// `default` (every layer when `None`).
pub(crate) fn gguf_sliding_layers(
    g: &GgufFile,
    c: &mut ModelConfig,
    default: Option<&LayerPattern>,
) -> Result<()> {
    let pattern = g.sliding_window_pattern(c.num_layers)?;
    if c.features.sliding_window.is_some() {
        c.features.sliding_layers = match (pattern, default) {
            (Some(flags), _) => flags,
            (None, Some(d)) => {
                g.assume(format!(
                    "GGUF has no layer pattern (`{}`): assuming {}, as llama.cpp does",
                    g.arch_key("attention.sliding_window_pattern"),
                    d.describe
                ));
                (d.layers)(c.num_layers)
            }
            (None, None) => Vec::new(),
        };
    }
    Ok(())
}

/// The rotary embedding of a GGUF's sliding layers: `rope.freq_base_swa` (else `theta`),
/// with the full layers' scaling when `scaled`, unscaled otherwise. Set only where it differs
/// from the full layers'.
pub(crate) fn gguf_local_rope(
    g: &GgufFile,
    c: &mut ModelConfig,
    theta: f64,
    scaled: bool,
) -> Result<()> {
    let theta = g.arch_f64("rope.freq_base_swa")?.unwrap_or(theta);
    let local = Rope {
        theta,
        scaling: if scaled { c.rope.scaling.clone() } else { None },
        rotary_dim: c.rope.rotary_dim,
    };
    let slides = (0..c.num_layers).any(|l| c.layer_window(l).is_some());
    if slides && local != c.rope {
        c.features.local_rope = Some(local);
    }
    Ok(())
}

/// A GGUF's experts (`{arch}.expert_count`, `expert_used_count`, and the experts' width in
/// `expert_feed_forward_length`, else `feed_forward_length`).
pub(crate) fn gguf_moe(gguf: &GgufFile, c: &ModelConfig, scoring: MoeScoring) -> Result<Moe> {
    // llama.cpp's graph for these architectures fixes the scoring and ignores both keys; a file
    // that names another scoring describes a model neither runs.
    let gating = gguf.arch_usize("expert_gating_func")?;
    let own_gating = match scoring {
        MoeScoring::SoftmaxTopK { .. } => 1, // softmax over the logits
        MoeScoring::TopKSoftmax => 3,        // softmax over the chosen weights
    };
    if let Some(g) = gating.filter(|&g| g != 0 && g != own_gating) {
        return Err(gguf.bad(format!(
            "metadata `{}` = {g}: this architecture's experts are scored by gating function {own_gating}",
            gguf.arch_key("expert_gating_func")
        )));
    }
    let norm = gguf.arch_bool("expert_weights_norm")?;
    if let (Some(n), MoeScoring::SoftmaxTopK { renormalize }) = (norm, scoring) {
        if n != renormalize {
            return Err(gguf.bad(format!(
                "metadata `{}` = {n}: this architecture's top-k weights are {}renormalized",
                gguf.arch_key("expert_weights_norm"),
                if renormalize { "" } else { "not " }
            )));
        }
    }
    let key = |k: &str| {
        gguf.arch_usize(k)?.ok_or_else(|| {
            gguf.bad(format!(
                "metadata `{}` is missing for a mixture of experts",
                gguf.arch_key(k)
            ))
        })
    };
    Ok(Moe {
        routing: MoeRouting {
            num_experts: key("expert_count")?,
            top_k: key("expert_used_count")?,
            scoring,
        },
        expert_intermediate_size: gguf
            .arch_usize("expert_feed_forward_length")?
            .unwrap_or(c.intermediate_size),
        sparse_layers: Vec::new(),
        biases: false,
    })
}
