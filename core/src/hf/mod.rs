//! Hugging Face model directories: `config.json` + `*.safetensors` (single file or sharded with
//! `model.safetensors.index.json`), memory-mapped and converted to f32 on load.

use std::path::Path;

use serde::Deserialize;

use crate::config::{ModelConfig, RopeScaling, RopeStyle};
use crate::error::{InferError, Result};
use crate::weights::{LayerWeight, WeightName};

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| InferError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| InferError::Json {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: usize,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    sliding_window: Option<usize>,
}

pub fn parse_config(path: &Path) -> Result<ModelConfig> {
    let raw: HfConfig = read_json(path)?;
    let arch = raw
        .model_type
        .clone()
        .or_else(|| raw.architectures.first().cloned())
        .unwrap_or_default();
    let attention_bias = match arch.as_str() {
        "llama" | "mistral" => raw.attention_bias.unwrap_or(false),
        "qwen2" => true,
        _ => return Err(InferError::UnsupportedArchitecture(arch)),
    };
    let mut max_pos = raw.max_position_embeddings;
    if let Some(window) = raw.sliding_window.filter(|w| *w < max_pos) {
        // Sliding-window attention is not implemented; within the window it is exact.
        tracing::warn!(
            "{arch}: sliding window {window} < context {max_pos}; limiting the context to {window}"
        );
        max_pos = window;
    }
    let config = ModelConfig {
        vocab_size: raw.vocab_size,
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        num_layers: raw.num_hidden_layers,
        num_heads: raw.num_attention_heads,
        num_kv_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
        head_dim: raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads.max(1)),
        rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6) as f32,
        rope_theta: raw.rope_theta.unwrap_or(10000.0),
        rope_scaling: parse_rope_scaling(raw.rope_scaling.as_ref())?,
        rope_style: RopeStyle::HalfSplit,
        max_position_embeddings: max_pos,
        tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
        attention_bias,
        architecture: arch,
    };
    config.validate()?;
    Ok(config)
}

fn parse_rope_scaling(v: Option<&serde_json::Value>) -> Result<Option<RopeScaling>> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let ty = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("");
    let num = |k: &str| v.get(k).and_then(|x| x.as_f64());
    let need = |k: &str| {
        num(k).ok_or_else(|| InferError::Config(format!("rope_scaling `{ty}` lacks `{k}`")))
    };
    match ty {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: need("factor")?,
        })),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: need("original_max_position_embeddings")?,
        })),
        other => Err(InferError::Config(format!(
            "unsupported rope_scaling type `{other}` (supported: linear, llama3)"
        ))),
    }
}

/// The name HF Llama-family checkpoints give a canonical weight.
pub fn hf_tensor_name(w: WeightName) -> String {
    match w {
        WeightName::Embed => "model.embed_tokens.weight".into(),
        WeightName::FinalNorm => "model.norm.weight".into(),
        WeightName::LmHead => "lm_head.weight".into(),
        WeightName::Layer(i, lw) => {
            let s = match lw {
                LayerWeight::AttnNorm => "input_layernorm.weight",
                LayerWeight::Q => "self_attn.q_proj.weight",
                LayerWeight::K => "self_attn.k_proj.weight",
                LayerWeight::V => "self_attn.v_proj.weight",
                LayerWeight::QBias => "self_attn.q_proj.bias",
                LayerWeight::KBias => "self_attn.k_proj.bias",
                LayerWeight::VBias => "self_attn.v_proj.bias",
                LayerWeight::O => "self_attn.o_proj.weight",
                LayerWeight::FfnNorm => "post_attention_layernorm.weight",
                LayerWeight::Gate => "mlp.gate_proj.weight",
                LayerWeight::Up => "mlp.up_proj.weight",
                LayerWeight::Down => "mlp.down_proj.weight",
            };
            format!("model.layers.{i}.{s}")
        }
    }
}

#[cfg(feature = "native")]
mod safetensors_weights;
#[cfg(feature = "native")]
pub use safetensors_weights::SafetensorsWeights;
