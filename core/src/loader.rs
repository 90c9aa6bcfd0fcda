//! Opens a model (GGUF file, HF directory or hub id) into config + weight source + tokenizer,
//! or, for the engine builder's callers, whatever a `LoadRequest` names (dummy weights, a
//! borrowed tokenizer or chat template).

use std::path::Path;

use crate::config::ModelConfig;
use crate::error::{InferError, Result};
use crate::gguf::GgufFile;
use crate::hf::{read_json, SafetensorsWeights};
use crate::hub::{resolve, ModelLocation};
use crate::model::read_config::parse_hf_config;
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
            let (config, tokenizer) = gguf.read_model()?;
            Ok(ModelFiles {
                weights: Box::new(ModelWeights::new(gguf, &config)),
                config,
                tokenizer,
                location,
            })
        }
        ModelLocation::HfDir(dir) => {
            let config = parse_hf_config(&dir.join("config.json"))?;
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
        let as_id = |x: &serde_json::Value| {
            x.as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(bad)
        };
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

/// Where a model's weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsFrom {
    /// Its own file(s).
    File,
    /// Random values in its shapes (`--load-format dummy`), matrices as blocks of `packed`
    /// (Q4_0 / Q8_0) or f32.
    Dummy {
        packed: Option<crate::gguf::GgmlType>,
    },
}

/// What to open: the model, where its weights come from, and a tokenizer or chat template
/// taken from elsewhere.
#[derive(Debug, Clone, Copy)]
pub struct LoadRequest<'a> {
    /// A GGUF file, an HF directory or hub id; for dummy weights also a config.json.
    pub model: &'a str,
    pub weights: WeightsFrom,
    /// Take the tokenizer from this model instead.
    pub tokenizer: Option<&'a str>,
    /// A Jinja chat template to use instead of the model's: a file, or the template itself.
    pub chat_template: Option<&'a str>,
}

/// A model opened for loading: the config, its weights (not yet read) and the tokenizer.
pub struct OpenedModel {
    pub config: ModelConfig,
    pub weights: Box<dyn WeightSource>,
    pub tokenizer: Tokenizer,
}

/// Opens what `req` names; `Model::load` (or `load_sharded`) then uploads the weights.
pub fn open_request(req: &LoadRequest) -> Result<OpenedModel> {
    let (config, weights, tokenizer): (_, Box<dyn WeightSource>, _) = match req.weights {
        WeightsFrom::File => {
            let files = open_model(req.model)?;
            tracing::info!(location = ?files.location, "opening model");
            (files.config, files.weights, Some(files.tokenizer))
        }
        WeightsFrom::Dummy { packed } => {
            let (config, tokenizer) = crate::dummy::open_dummy_config(req.model)?;
            tracing::info!(model = %req.model, "random (dummy) weights");
            let weights = crate::dummy::DummyWeights::new(config.clone(), 0);
            let weights = match packed {
                Some(dtype) => weights.packed(dtype)?,
                None => weights,
            };
            (config, Box::new(weights), tokenizer)
        }
    };
    let tokenizer = match (req.tokenizer, tokenizer) {
        (Some(spec), _) => match crate::dummy::hf_tokenizer(Path::new(spec))? {
            // A directory of tokenizer files alone (what `infer tokenizer export` writes), as
            // vLLM's --tokenizer takes.
            Some(t) => t,
            None => {
                open_model(spec)
                    .map_err(|e| {
                        InferError::Tokenizer(format!("loading the tokenizer from {spec}: {e}"))
                    })?
                    .tokenizer
            }
        },
        (None, Some(t)) => t,
        (None, None) => {
            return Err(InferError::Tokenizer(format!(
                "{} has no tokenizer (no tokenizer.json next to its config.json): pass --tokenizer MODEL",
                req.model
            )))
        }
    };
    let tokenizer = match req.chat_template {
        None => tokenizer,
        Some(t) => {
            let path = Path::new(t);
            let text = if path.is_file() {
                std::fs::read_to_string(path).map_err(|e| InferError::io(path, e))?
            } else {
                t.to_string()
            };
            tokenizer.with_chat_template(text).map_err(|e| {
                InferError::ChatTemplate(format!("the template given for the model's: {e}"))
            })?
        }
    };
    // A tokenizer taken from another model must only produce ids this one has.
    let borrowed = req.tokenizer.is_some() || req.weights != WeightsFrom::File;
    if borrowed && tokenizer.vocab_size() > config.vocab_size {
        return Err(InferError::Tokenizer(format!(
            "the tokenizer's vocabulary ({}) is larger than the model's ({})",
            tokenizer.vocab_size(),
            config.vocab_size
        )));
    }
    Ok(OpenedModel {
        config,
        weights,
        tokenizer,
    })
}
