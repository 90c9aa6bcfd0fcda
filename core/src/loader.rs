//! Opens a model (GGUF file, HF directory or hub id) into config + weight source + tokenizer.

use std::path::Path;

use crate::config::ModelConfig;
use crate::error::{InferError, Result};
use crate::gguf::GgufFile;
use crate::hf::{parse_config, read_json, SafetensorsWeights};
use crate::hub::{resolve, ModelLocation};
use crate::tokenizer::Tokenizer;
use crate::weights::{ModelWeights, WeightSource};

pub struct ModelFiles {
    pub config: ModelConfig,
    pub weights: Box<dyn WeightSource>,
    pub tokenizer: Tokenizer,
    pub location: ModelLocation,
}

pub fn open_model(spec: &str) -> Result<ModelFiles> {
    let location = resolve(spec)?;
    match &location {
        ModelLocation::Gguf(path) => {
            let gguf = GgufFile::open(path)?;
            let config = gguf.model_config()?;
            let tokenizer = Tokenizer::from_gguf(&gguf)?;
            Ok(ModelFiles {
                weights: Box::new(ModelWeights::new(gguf, &config)),
                config,
                tokenizer,
                location,
            })
        }
        ModelLocation::HfDir(dir) => {
            let config = parse_config(&dir.join("config.json"))?;
            let tokenizer = Tokenizer::from_hf_dir(dir, &hf_eos_ids(dir)?)?;
            let weights = SafetensorsWeights::open(dir)?;
            Ok(ModelFiles {
                weights: Box::new(ModelWeights::new(weights, &config)),
                config,
                tokenizer,
                location,
            })
        }
    }
}

/// `eos_token_id` (an int or a list) from config.json and generation_config.json.
fn hf_eos_ids(dir: &Path) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for file in ["config.json", "generation_config.json"] {
        let path = dir.join(file);
        if !path.is_file() {
            continue;
        }
        let v: serde_json::Value = read_json(&path)?;
        let bad = || InferError::Json {
            path: path.clone(),
            reason: "eos_token_id must be an integer or a list of integers".into(),
        };
        let as_id = |x: &serde_json::Value| x.as_u64().map(|i| i as u32).ok_or_else(bad);
        match v.get("eos_token_id") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(list)) => {
                for x in list {
                    ids.push(as_id(x)?);
                }
            }
            Some(x) => ids.push(as_id(x)?),
        }
    }
    ids.dedup();
    Ok(ids)
}
