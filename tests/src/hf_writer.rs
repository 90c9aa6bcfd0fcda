//! Saves a loaded model as an HF directory (config.json, tokenizer files, model.safetensors),
//! undoing GGUF's Q/K row permutation, as HF's own GGUF → transformers conversion does.

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use infer_core::model::names::Format;
use infer_core::weights::{permute_qk_rows, LayerWeight, WeightName};
use infer_core::{ModelConfig, RopeStyle};

use crate::Loaded;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;

#[derive(Clone, Copy)]
pub enum SaveDtype {
    F32,
    F16,
    BF16,
}

pub fn config_json(c: &ModelConfig) -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": c.architecture,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope.theta,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
    })
}

/// Writes `files` (a GGUF-loaded llama model) into `dir` as an HF model directory.
pub fn write_hf_dir(files: &Loaded, dir: &Path, dtype: SaveDtype) {
    let c = &files.config;
    let mut names = vec![WeightName::Embed, WeightName::FinalNorm];
    if !c.tie_word_embeddings {
        names.push(WeightName::LmHead);
    }
    for i in 0..c.num_layers {
        use LayerWeight::*;
        for lw in [AttnNorm, Q, K, V, O, FfnNorm, Gate, Up, Down] {
            names.push(WeightName::Layer(i, lw));
        }
        if c.attention_bias {
            for lw in [QBias, KBias, VBias] {
                names.push(WeightName::Layer(i, lw));
            }
        }
    }
    let mut blobs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for w in names {
        let t = files.weights.load(w, c).unwrap();
        // Only adjacent-pair (GGUF `llama`) models have permuted Q/K rows to undo.
        let permuted = c.rope_style == RopeStyle::AdjacentPairs;
        let data = match w {
            WeightName::Layer(_, LayerWeight::Q) if permuted => {
                permute_qk_rows(&t.data, c.num_heads, c.hidden_size, false)
            }
            WeightName::Layer(_, LayerWeight::K) if permuted => {
                permute_qk_rows(&t.data, c.num_kv_heads, c.hidden_size, false)
            }
            _ => t.data,
        };
        let bytes: Vec<u8> = match dtype {
            SaveDtype::F32 => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            SaveDtype::F16 => data
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect(),
            SaveDtype::BF16 => data
                .iter()
                .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                .collect(),
        };
        let name = c.family.spec().names.locate(Format::Hf, c, w).name;
        blobs.push((name, t.shape, bytes));
    }
    let st_dtype = match dtype {
        SaveDtype::F32 => Dtype::F32,
        SaveDtype::F16 => Dtype::F16,
        SaveDtype::BF16 => Dtype::BF16,
    };
    let views: HashMap<String, TensorView> = blobs
        .iter()
        .map(|(n, s, b)| (n.clone(), TensorView::new(st_dtype, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let mut config = config_json(c);
    config["eos_token_id"] = files.tokenizer.eos_token_ids().into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        files.tokenizer.to_json().unwrap(),
    )
    .unwrap();
    let tk_config = json!({ "chat_template": files.tokenizer.chat_template() });
    std::fs::write(dir.join("tokenizer_config.json"), tk_config.to_string()).unwrap();
}
