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
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_moe;

use crate::config::{ModelConfig, Moe, MoeRouting, MoeScoring};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;

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

/// A GGUF's experts (`{arch}.expert_count`, `expert_used_count`, and the experts' width in
/// `expert_feed_forward_length`, else `feed_forward_length`).
pub(crate) fn gguf_moe(gguf: &GgufFile, c: &ModelConfig, scoring: MoeScoring) -> Result<Moe> {
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
