//! Hugging Face model directories: `config.json` + `*.safetensors` (single file or sharded with
//! `model.safetensors.index.json`), memory-mapped and converted to f32 on load.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use serde::Deserialize;

use crate::config::{ModelConfig, RopeScaling, RopeStyle};
use crate::error::{InferError, Result};
use crate::weights::{HostTensor, LayerWeight, WeightName, WeightSource};

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

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    header_len: usize,
    metadata: Metadata,
}

/// The safetensors weights of an HF model directory.
pub struct SafetensorsWeights {
    dir: PathBuf,
    shards: Vec<Shard>,
    /// tensor name → shard index
    index: HashMap<String, usize>,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

impl SafetensorsWeights {
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<String> = if index_path.exists() {
            let idx: ShardIndex = read_json(&index_path)?;
            let mut f: Vec<String> = idx.weight_map.into_values().collect();
            f.sort();
            f.dedup();
            f
        } else if dir.join("model.safetensors").exists() {
            vec!["model.safetensors".into()]
        } else {
            return Err(InferError::ModelDir {
                path: dir.to_path_buf(),
                reason: "no model.safetensors or model.safetensors.index.json".into(),
            });
        };
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        for name in files {
            let path = dir.join(&name);
            let file = File::open(&path).map_err(|e| InferError::io(&path, e))?;
            // SAFETY: read-only map kept alive by `Shard`; the file is assumed not to be
            // truncated while the process runs (the usual mmap loader contract).
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| InferError::io(&path, e))?;
            let (header_len, metadata) =
                SafeTensors::read_metadata(&mmap).map_err(|e| InferError::Safetensors {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            for tensor in metadata.tensors().keys() {
                index.insert(tensor.clone(), shards.len());
            }
            shards.push(Shard {
                path,
                mmap,
                header_len,
                metadata,
            });
        }
        Ok(SafetensorsWeights {
            dir: dir.to_path_buf(),
            shards,
            index,
        })
    }
}

fn convert(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

impl WeightSource for SafetensorsWeights {
    fn source_name(&self) -> String {
        self.dir.display().to_string()
    }

    fn tensor_name(&self, w: WeightName) -> String {
        hf_tensor_name(w)
    }

    fn contains(&self, w: WeightName) -> bool {
        self.index.contains_key(&self.tensor_name(w))
    }

    fn load_raw(&self, w: WeightName) -> Result<HostTensor> {
        let name = self.tensor_name(w);
        let missing = || InferError::MissingTensor {
            name: name.clone(),
            source_name: self.source_name(),
        };
        let shard = &self.shards[*self.index.get(&name).ok_or_else(missing)?];
        let info = shard.metadata.info(&name).ok_or_else(missing)?;
        let (start, end) = info.data_offsets;
        let base = 8 + shard.header_len;
        // read_metadata validated that the offsets tile the buffer; check anyway, cheaply.
        let bytes =
            shard
                .mmap
                .get(base + start..base + end)
                .ok_or_else(|| InferError::Safetensors {
                    path: shard.path.clone(),
                    reason: format!("tensor `{name}` lies outside the file"),
                })?;
        let data = convert(info.dtype, bytes).ok_or_else(|| InferError::UnsupportedDtype {
            name: name.clone(),
            dtype: format!("{:?}", info.dtype),
        })?;
        Ok(HostTensor::new(info.shape.clone(), data))
    }
}
