//! Hugging Face model directories: `config.json` + `*.safetensors` (single file or sharded with
//! `model.safetensors.index.json`), memory-mapped and converted to f32 on load. The config is
//! read in both spellings transformers writes: ≤ 4 (`rope_theta`, `rope_scaling`,
//! `partial_rotary_factor` at the top) and ≥ 5 (`rope_parameters`, nested per layer type for
//! models whose sliding layers rotate differently).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{InferError, Result};
use crate::rope::{longrope_attention_factor, yarn_mscale, Rope, RopeScaling};

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| InferError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| InferError::Json {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Keys that change the math, with the value that leaves it as Llama's. A config that sets one
/// to anything else is refused by name unless its family reads it (`FamilySpec::hf_keys`).
const MATH_KEYS: &[(&str, &str)] = &[
    ("attention_bias", "false"),
    ("mlp_bias", "false"),
    ("hidden_act", "\"silu\""),
    ("hidden_activation", "\"silu\""),
    ("sliding_window", "null"),
    ("use_sliding_window", "false"),
    ("attn_logit_softcapping", "null"),
    ("final_logit_softcapping", "null"),
    ("query_pre_attn_scalar", "null"),
    ("embedding_multiplier", "1.0"),
    ("residual_multiplier", "1.0"),
    ("attention_multiplier", "null"),
    ("logits_scaling", "1.0"),
    ("use_qk_norm", "false"),
    ("qk_layernorm", "false"),
    ("use_parallel_residual", "false"),
    ("rope_local_base_freq", "null"),
    ("clip_qkv", "null"),
    ("use_bidirectional_attention", "null"),
    ("num_experts", "null"),
    ("num_local_experts", "null"),
];

/// A parsed config.json.
pub struct HfConfig {
    pub path: PathBuf,
    pub raw: Map<String, Value>,
}

impl HfConfig {
    pub fn open(path: &Path) -> Result<Self> {
        match read_json::<Value>(path)? {
            Value::Object(raw) => Ok(HfConfig {
                path: path.to_path_buf(),
                raw,
            }),
            _ => Err(InferError::Json {
                path: path.to_path_buf(),
                reason: "config.json is not a JSON object".into(),
            }),
        }
    }

    pub fn bad(&self, reason: impl std::fmt::Display) -> InferError {
        InferError::Config(format!("{}: {reason}", self.path.display()))
    }

    /// A key that is absent or null reads as `None`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.raw.get(key).filter(|v| !v.is_null())
    }

    pub fn f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| self.bad(format!("`{key}` is {v}, expected a number")))
            })
            .transpose()
    }

    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.bad(format!("`{key}` is {v}, expected a whole number")))
            })
            .transpose()
    }

    pub fn require_usize(&self, key: &str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| self.bad(format!("`{key}` is missing")))
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.bad(format!("`{key}` is {v}, expected true or false")))
            })
            .transpose()
    }

    pub fn str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.bad(format!("`{key}` is {v}, expected a string")))
            })
            .transpose()
    }

    /// Per layer, whether it slides, from `layer_types` (transformers ≥ 4.53); `None` when
    /// absent.
    pub fn sliding_layers(&self, num_layers: usize) -> Result<Option<Vec<bool>>> {
        let Some(v) = self.get("layer_types") else {
            return Ok(None);
        };
        let list = v
            .as_array()
            .ok_or_else(|| self.bad("`layer_types` is not a list"))?;
        if list.len() != num_layers {
            return Err(self.bad(format!(
                "`layer_types` has {} entries for {num_layers} layers",
                list.len()
            )));
        }
        list.iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(false),
                Some("sliding_attention") => Ok(true),
                _ => Err(self.bad(format!(
                    "layer type {t} (supported: full_attention, sliding_attention)"
                ))),
            })
            .collect::<Result<Vec<bool>>>()
            .map(Some)
    }

    /// The rotary embedding of layers of `layer_type` (`full_attention` or
    /// `sliding_attention`), from either spelling.
    pub fn rope(&self, layer_type: &str, head_dim: usize, max_pos: usize) -> Result<Rope> {
        let empty = Map::new();
        let top = match self
            .get("rope_parameters")
            .or_else(|| self.get("rope_scaling"))
        {
            None => &empty,
            Some(Value::Object(m)) => m,
            Some(v) => return Err(self.bad(format!("rope parameters {v} are not an object"))),
        };
        let nested = top.contains_key("full_attention") || top.contains_key("sliding_attention");
        let params = match (nested, layer_type) {
            (true, _) => match top.get(layer_type) {
                Some(Value::Object(m)) => m,
                _ => &empty,
            },
            // The old spelling's scaling is the full layers'; sliding ones rotate unscaled
            // at `rope_local_base_freq` (Gemma 3), as transformers reads it.
            (false, "sliding_attention") => &empty,
            (false, _) => top,
        };
        let num = |k: &str| params.get(k).and_then(Value::as_f64);
        let local_theta = if layer_type == "sliding_attention" {
            self.f64("rope_local_base_freq")?
        } else {
            None
        };
        let theta = match num("rope_theta") {
            Some(t) => t,
            None => local_theta.or(self.f64("rope_theta")?).unwrap_or(10000.0),
        };
        let partial = match num("partial_rotary_factor") {
            Some(p) => p,
            None => self.f64("partial_rotary_factor")?.unwrap_or(1.0),
        };
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(self.bad(format!("partial_rotary_factor {partial} must be in (0, 1]")));
        }
        // In (0, head_dim]: `partial` is in (0, 1].
        #[expect(clippy::cast_possible_truncation, reason = "at most head_dim")]
        let rotary_dim = (head_dim as f64 * partial) as usize;
        let ty = params
            .get("rope_type")
            .or_else(|| params.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let original = match num("original_max_position_embeddings") {
            Some(o) => o,
            None => self
                .f64("original_max_position_embeddings")?
                .unwrap_or(max_pos as f64),
        };
        let need =
            |k: &str| num(k).ok_or_else(|| self.bad(format!("rope scaling `{ty}` lacks `{k}`")));
        let scaling = match ty {
            "default" => None,
            "linear" => Some(RopeScaling::Linear {
                factor: need("factor")?,
            }),
            "llama3" => Some(RopeScaling::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_position_embeddings: original,
            }),
            "yarn" => {
                let factor = num("factor").unwrap_or(max_pos as f64 / original);
                let attention_factor = match (num("attention_factor"), num("mscale"), num("mscale_all_dim")) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        yarn_mscale(factor, m) / yarn_mscale(factor, all)
                    }
                    _ => yarn_mscale(factor, 1.0),
                };
                Some(RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: num("beta_fast").unwrap_or(32.0),
                    beta_slow: num("beta_slow").unwrap_or(1.0),
                    attention_factor,
                    truncate: params.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                })
            }
            "longrope" | "su" => {
                let list = |k: &str| -> Result<Vec<f64>> {
                    params
                        .get(k)
                        .and_then(Value::as_array)
                        .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
                        .ok_or_else(|| self.bad(format!("rope scaling `{ty}` lacks a numeric `{k}` list")))
                };
                let original = match original {
                    o if (1.0..=f64::from(u32::MAX)).contains(&o) => {
                        #[expect(clippy::cast_possible_truncation, reason = "checked above")]
                        let o = o as usize;
                        o
                    }
                    o => {
                        return Err(self.bad(format!(
                            "original_max_position_embeddings {o} is not a context length"
                        )))
                    }
                };
                let factor = num("factor").unwrap_or(max_pos as f64 / original.max(1) as f64);
                Some(RopeScaling::LongRope {
                    short_factor: list("short_factor")?,
                    long_factor: list("long_factor")?,
                    original_max_position_embeddings: original,
                    attention_factor: num("attention_factor")
                        .unwrap_or_else(|| longrope_attention_factor(factor, original)),
                })
            }
            other => {
                return Err(self.bad(format!(
                    "unsupported rope scaling type `{other}` (supported: default, linear, llama3, yarn, longrope)"
                )))
            }
        };
        Ok(Rope {
            theta,
            scaling,
            rotary_dim,
        })
    }

    /// Refuses a key that changes the math unless the family reads it (`family_keys`).
    pub(crate) fn check_math_keys(&self, family: &str, family_keys: &[&str]) -> Result<()> {
        for (key, neutral) in MATH_KEYS {
            if family_keys.contains(key) {
                continue;
            }
            let Some(v) = self.raw.get(*key) else {
                continue;
            };
            let neutral: Value = serde_json::from_str(neutral).unwrap_or(Value::Null);
            // Absent, null or the neutral value: the math is Llama's.
            let same = v.is_null()
                || match (v, &neutral) {
                    (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
                    (Value::Bool(false), Value::Null) => true,
                    _ => *v == neutral,
                };
            if !same {
                return Err(self.bad(format!(
                    "`{key}` = {v} changes the model's math and {} models do not have it; refusing rather than ignoring it",
                    family
                )));
            }
        }
        if let Some(types) = self.get("layer_types") {
            let all_full = types
                .as_array()
                .is_some_and(|l| l.iter().all(|t| t == "full_attention"));
            if !all_full && !family_keys.contains(&"layer_types") {
                return Err(self.bad(format!(
                    "`layer_types` sets sliding layers and {} models do not have them",
                    family
                )));
            }
        }
        Ok(())
    }
}

#[cfg(feature = "native")]
mod safetensors_weights;
#[cfg(feature = "native")]
pub use safetensors_weights::SafetensorsWeights;
