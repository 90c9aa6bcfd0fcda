//! One file per family: how its blocks differ from Llama's, where its config keeps those
//! differences (config.json and GGUF metadata), and the tensor names it does not share.

pub mod gemma2;
pub mod gemma3;
pub mod granite;
pub mod llama;
pub mod mistral;
pub mod olmo2;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;

use crate::config::ModelConfig;
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
