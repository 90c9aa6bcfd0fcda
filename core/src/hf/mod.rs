//! Hugging Face model directories: `config.json` + `*.safetensors` (single file or sharded with
//! `model.safetensors.index.json`), memory-mapped and converted to f32 on load. The config is
//! read in both spellings transformers writes: ≤ 4 (`rope_theta`, `rope_scaling`,
//! `partial_rotary_factor` at the top) and ≥ 5 (`rope_parameters`, nested per layer type for
//! models whose sliding layers rotate differently).

use std::cell::RefCell;
use std::collections::BTreeSet;
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

/// A parsed config.json. Every key a loader asks for is recorded (`keys_read`), nested RoPE
/// parameters as `rope_parameters.factor` or `rope_parameters.full_attention.factor`, so a
/// key nothing read is refused by name (`model::hf_keys`).
pub struct HfConfig {
    pub path: PathBuf,
    pub raw: Map<String, Value>,
    read: RefCell<BTreeSet<String>>,
}

impl HfConfig {
    pub fn open(path: &Path) -> Result<Self> {
        match read_json::<Value>(path)? {
            Value::Object(raw) => Ok(HfConfig {
                path: path.to_path_buf(),
                raw,
                read: RefCell::default(),
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

    /// A key that is absent or null reads as `None`; either way it is recorded as read.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.record(key);
        self.raw.get(key).filter(|v| !v.is_null())
    }

    /// Records `key` (a dotted path for nested keys) as read.
    pub(crate) fn record(&self, key: &str) {
        self.read.borrow_mut().insert(key.to_string());
    }

    /// The keys read so far.
    pub fn keys_read(&self) -> BTreeSet<String> {
        self.read.borrow().clone()
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
    /// `sliding_attention`), from either spelling. A parameter given both at the top and in
    /// the RoPE parameters must agree.
    pub fn rope(&self, layer_type: &str, head_dim: usize, max_pos: usize) -> Result<Rope> {
        let empty = Map::new();
        let (src, top) = match (self.get("rope_parameters"), self.get("rope_scaling")) {
            (Some(_), Some(_)) => {
                return Err(self.bad(
                    "both `rope_parameters` and `rope_scaling`: two descriptions of one RoPE",
                ))
            }
            (Some(v), None) => ("rope_parameters", Some(v)),
            (None, Some(v)) => ("rope_scaling", Some(v)),
            (None, None) => ("", None),
        };
        let top = match top {
            None => &empty,
            Some(Value::Object(m)) => m,
            Some(v) => return Err(self.bad(format!("`{src}` is {v}, not an object"))),
        };
        let nested = top.contains_key("full_attention") || top.contains_key("sliding_attention");
        let (params, path) = match (nested, layer_type) {
            (true, _) => match top.get(layer_type) {
                Some(Value::Object(m)) => (m, format!("{src}.{layer_type}")),
                None | Some(Value::Null) => (&empty, String::new()),
                Some(v) => {
                    return Err(self.bad(format!("`{src}.{layer_type}` is {v}, not an object")))
                }
            },
            // The old spelling's scaling is the full layers'; sliding ones rotate unscaled
            // at `rope_local_base_freq` (Gemma 3), as transformers reads it.
            (false, "sliding_attention") => (&empty, String::new()),
            (false, _) => (top, src.to_string()),
        };
        let get = |k: &str| {
            self.record(&format!("{path}.{k}"));
            params.get(k).filter(|v| !v.is_null())
        };
        let num = |k: &str| -> Result<Option<f64>> {
            get(k)
                .map(|v| {
                    v.as_f64()
                        .ok_or_else(|| self.bad(format!("`{path}.{k}` is {v}, expected a number")))
                })
                .transpose()
        };
        // A value in the parameters, else at the top; both present must agree.
        let either = |k: &str| -> Result<Option<f64>> {
            match (num(k)?, self.f64(k)?) {
                (Some(a), Some(b)) if a != b => {
                    Err(self.bad(format!("`{path}.{k}` = {a} but `{k}` = {b}: which one?")))
                }
                (a, b) => Ok(a.or(b)),
            }
        };
        let local_theta = if layer_type == "sliding_attention" {
            self.f64("rope_local_base_freq")?
        } else {
            None
        };
        let theta = match num("rope_theta")? {
            Some(t) => t,
            None => match local_theta {
                Some(t) => t,
                None => self.f64("rope_theta")?.unwrap_or(10000.0),
            },
        };
        if layer_type != "sliding_attention" {
            either("rope_theta")?;
        }
        let partial = either("partial_rotary_factor")?.unwrap_or(1.0);
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(self.bad(format!("partial_rotary_factor {partial} must be in (0, 1]")));
        }
        // In (0, head_dim]: `partial` is in (0, 1].
        #[expect(clippy::cast_possible_truncation, reason = "at most head_dim")]
        let rotary_dim = (head_dim as f64 * partial) as usize;
        let ty = match (get("rope_type"), get("type")) {
            (Some(a), Some(b)) if a != b => {
                return Err(self.bad(format!("`{path}.rope_type` = {a} but `{path}.type` = {b}")))
            }
            (Some(t), _) | (None, Some(t)) => t
                .as_str()
                .ok_or_else(|| self.bad(format!("`{path}.rope_type` is {t}, expected a string")))?,
            (None, None) => "default",
        };
        let original = either("original_max_position_embeddings")?.unwrap_or(max_pos as f64);
        let need = |k: &str| -> Result<f64> {
            num(k)?.ok_or_else(|| self.bad(format!("rope scaling `{ty}` lacks `{k}`")))
        };
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
                let factor = num("factor")?.unwrap_or(max_pos as f64 / original);
                let attention_factor = match (num("attention_factor")?, num("mscale")?, num("mscale_all_dim")?) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        yarn_mscale(factor, m) / yarn_mscale(factor, all)
                    }
                    _ => yarn_mscale(factor, 1.0),
                };
                Some(RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: num("beta_fast")?.unwrap_or(32.0),
                    beta_slow: num("beta_slow")?.unwrap_or(1.0),
                    attention_factor,
                    truncate: match get("truncate") {
                        None => true,
                        Some(v) => v.as_bool().ok_or_else(|| {
                            self.bad(format!("`{path}.truncate` is {v}, expected true or false"))
                        })?,
                    },
                })
            }
            "longrope" | "su" => {
                let list = |k: &str| -> Result<Vec<f64>> {
                    get(k)
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
                let factor = num("factor")?.unwrap_or(max_pos as f64 / original.max(1) as f64);
                Some(RopeScaling::LongRope {
                    short_factor: list("short_factor")?,
                    long_factor: list("long_factor")?,
                    original_max_position_embeddings: original,
                    attention_factor: num("attention_factor")?
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
}

#[cfg(feature = "native")]
mod safetensors_weights;
#[cfg(feature = "native")]
pub use safetensors_weights::SafetensorsWeights;
