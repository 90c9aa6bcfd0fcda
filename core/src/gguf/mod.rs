//! GGUF models: config from metadata (the family's keys in `model::families`), tensors by
//! their GGUF names, tokenizer from metadata.

pub(crate) mod dtype;
pub mod kquants;
mod reader;
mod sampling;

pub use dtype::GgmlType;
pub use reader::{GgufFile, GgufTensorInfo, GgufValue};

use crate::error::{InferError, Result};
use crate::host_tensor::{HostTensor, PackedTensor};
use crate::model::names::Format;
use crate::rope::{longrope_attention_factor, yarn_mscale, RopeScaling};
use crate::weights::TensorStore;

/// Tensors the config itself may need before any weight: Llama 3.1's RoPE frequencies and
/// Phi-3's LongRoPE factors.
pub const CONFIG_TENSORS: [&str; 3] = [
    "rope_freqs.weight",
    "rope_factors_long.weight",
    "rope_factors_short.weight",
];

impl GgufFile {
    pub(crate) fn arch_key(&self, key: &str) -> String {
        let arch = self
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or("llama");
        format!("{arch}.{key}")
    }

    pub(crate) fn meta_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.bad(format!(
                        "metadata `{key}` is {}, expected an integer",
                        v.describe()
                    ))
                }),
        }
    }

    pub(crate) fn require_usize(&self, key: &str) -> Result<usize> {
        self.meta_usize(key)?
            .ok_or_else(|| self.bad(format!("metadata `{key}` is missing")))
    }

    pub(crate) fn meta_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                self.bad(format!(
                    "metadata `{key}` is {}, expected a number",
                    v.describe()
                ))
            }),
        }
    }

    pub(crate) fn bad(&self, reason: String) -> InferError {
        InferError::Gguf {
            path: self.path.clone(),
            reason,
        }
    }

    /// `block_count` against the tensors: every layer up to it must have tensors (`blk.{i}.`), so
    /// a corrupt count is refused before anything is sized by it.
    pub(crate) fn check_layers_present(&self, num_layers: usize) -> Result<()> {
        let mut present = std::collections::BTreeSet::new();
        for name in self.tensors.keys() {
            let index = name
                .strip_prefix("blk.")
                .and_then(|rest| rest.split('.').next())
                .and_then(|i| i.parse::<usize>().ok());
            if let Some(i) = index {
                present.insert(i);
            }
        }
        match (0..num_layers).find(|i| !present.contains(i)) {
            None => Ok(()),
            Some(missing) => Err(self.bad(format!(
                "block_count is {num_layers} but the file has no tensors for layer {missing} ({} layers found)",
                present.len()
            ))),
        }
    }

    /// `{arch}.{key}` as an integer, if present.
    pub fn arch_usize(&self, key: &str) -> Result<Option<usize>> {
        self.meta_usize(&self.arch_key(key))
    }

    /// `{arch}.{key}` as a number, if present.
    pub fn arch_f64(&self, key: &str) -> Result<Option<f64>> {
        self.meta_f64(&self.arch_key(key))
    }

    /// `{arch}.{key}` as true or false, if present.
    pub fn arch_bool(&self, key: &str) -> Result<Option<bool>> {
        let key = self.arch_key(key);
        match self.get(&key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                self.bad(format!(
                    "metadata `{key}` is {}, expected true or false",
                    v.describe()
                ))
            }),
        }
    }

    /// `{arch}.attention.sliding_window`, with `0` meaning none (as llama.cpp writes Phi-4).
    pub fn sliding_window(&self) -> Result<Option<usize>> {
        Ok(self
            .meta_usize(&self.arch_key("attention.sliding_window"))?
            .filter(|&w| w > 0))
    }

    /// Which layers slide, from `{arch}.attention.sliding_window_pattern`: a flag per layer,
    /// or llama.cpp's period `n` (layer `i` slides unless it is the last of each `n`; 0: all
    /// slide). `None` when the file has no pattern.
    pub fn sliding_window_pattern(&self, num_layers: usize) -> Result<Option<Vec<bool>>> {
        let key = self.arch_key("attention.sliding_window_pattern");
        let Some(v) = self.get(&key) else {
            return Ok(None);
        };
        if let Some(n) = v.as_u64() {
            let flags = (0..num_layers as u64)
                .map(|i| n == 0 || i % n < n - 1)
                .collect();
            return Ok(Some(flags));
        }
        let flags = v.as_array().and_then(|a| {
            a.iter()
                .map(|x| x.as_bool().or(x.as_u64().map(|n| n != 0)))
                .collect::<Option<Vec<bool>>>()
        });
        match flags {
            Some(f) if f.len() == num_layers => Ok(Some(f)),
            _ => Err(self.bad(format!(
                "metadata `{key}` is {}, expected {num_layers} flags or a period",
                v.describe()
            ))),
        }
    }

    /// `{arch}.{key}`, when present, must equal `expected` (a width infer takes from another
    /// key, such as the value heads' from the key heads').
    pub(crate) fn require_equal(&self, key: &str, expected: usize, what: &str) -> Result<()> {
        match self.arch_usize(key)? {
            Some(v) if v != expected => Err(self.bad(format!(
                "metadata `{}` = {v} but {what} is {expected}: unequal widths are not supported",
                self.arch_key(key)
            ))),
            _ => Ok(()),
        }
    }

    /// The RoPE scaling, read as llama.cpp reads it: a `rope_freqs` tensor (Llama 3.1), or
    /// `rope.scaling.type` (linear when absent, as llama.cpp defaults) with its factor and
    /// parameters. Every scaling key is read whatever the type, and one the type does not use
    /// is refused unless it holds the value that changes nothing.
    pub(crate) fn rope_scaling(&self, max_pos: usize) -> Result<Option<RopeScaling>> {
        let k = |s: &str| self.arch_key(s);
        let ty = match self.get(&k("rope.scaling.type")) {
            None => None,
            Some(v) => Some(v.as_str().ok_or_else(|| {
                self.bad(format!(
                    "metadata `{}` is {}, expected a string",
                    k("rope.scaling.type"),
                    v.describe()
                ))
            })?),
        };
        // `rope.scale_linear` is llama.cpp's older name for the same factor.
        let factor = match (
            self.meta_f64(&k("rope.scaling.factor"))?,
            self.meta_f64(&k("rope.scale_linear"))?,
        ) {
            (Some(a), Some(b)) if a != b => {
                return Err(self.bad(format!(
                    "metadata `{}` = {a} but `{}` = {b}: which factor?",
                    k("rope.scaling.factor"),
                    k("rope.scale_linear")
                )))
            }
            (a, b) => a.or(b),
        };
        let original = self.meta_f64(&k("rope.scaling.original_context_length"))?;
        let attn_factor = self.meta_f64(&k("rope.scaling.attn_factor"))?;
        let yarn_attn_factor = self.meta_f64(&k("rope.scaling.yarn_attn_factor"))?;
        let beta_fast = self.meta_f64(&k("rope.scaling.yarn_beta_fast"))?;
        let beta_slow = self.meta_f64(&k("rope.scaling.yarn_beta_slow"))?;
        let long = self.tensors.get("rope_factors_long.weight");
        let short = self.tensors.get("rope_factors_short.weight");
        let longrope = matches!(ty, None | Some("longrope")) && (long.is_some() || short.is_some());
        let is_yarn = ty == Some("yarn");
        // YaRN's own keys, and an attention factor outside YaRN and LongRoPE, change nothing
        // in llama.cpp's reading only at their defaults.
        for (key, value, neutral, applies) in [
            (
                "rope.scaling.yarn_attn_factor",
                yarn_attn_factor,
                None,
                is_yarn,
            ),
            (
                "rope.scaling.yarn_beta_fast",
                beta_fast,
                Some(32.0),
                is_yarn,
            ),
            ("rope.scaling.yarn_beta_slow", beta_slow, Some(1.0), is_yarn),
            (
                "rope.scaling.attn_factor",
                attn_factor,
                Some(1.0),
                is_yarn || longrope,
            ),
        ] {
            if let Some(v) = value.filter(|v| !applies && Some(*v) != neutral) {
                return Err(self.bad(format!(
                    "metadata `{}` = {v} with rope scaling {}: it has no meaning there",
                    k(key),
                    ty.unwrap_or("(none)")
                )));
            }
        }
        if let Some(info) = self.tensors.get("rope_freqs.weight") {
            if ty.is_some_and(|t| t != "none" && t != "linear")
                || factor.is_some_and(|f| f != 1.0 && f != 0.0)
            {
                return Err(self.bad(format!(
                    "rope_freqs.weight together with rope scaling {} (factor {factor:?}): one or the other",
                    ty.unwrap_or("linear")
                )));
            }
            let t = self.dequantize(info)?;
            return Ok(Some(RopeScaling::FreqFactors(t.data)));
        }
        if longrope {
            let (Some(long), Some(short)) = (long, short) else {
                return Err(
                    self.bad("LongRoPE needs both rope_factors_long and rope_factors_short".into())
                );
            };
            let as_f64 = |t: HostTensor| t.data.into_iter().map(f64::from).collect();
            let original = match original {
                Some(o) if (1.0..=f64::from(u32::MAX)).contains(&o) => {
                    #[expect(clippy::cast_possible_truncation, reason = "checked above")]
                    let o = o as usize;
                    o
                }
                Some(o) => {
                    return Err(self.bad(format!(
                        "rope.scaling.original_context_length {o} is not a context length"
                    )))
                }
                None => max_pos,
            };
            let attention_factor = match attn_factor {
                Some(a) => a,
                None => {
                    longrope_attention_factor(max_pos as f64 / original.max(1) as f64, original)
                }
            };
            return Ok(Some(RopeScaling::LongRope {
                short_factor: as_f64(self.dequantize(short)?),
                long_factor: as_f64(self.dequantize(long)?),
                original_max_position_embeddings: original,
                attention_factor,
            }));
        }
        // llama.cpp: a factor of 0 (or none) is no scaling.
        let factor = factor.filter(|&f| f != 0.0);
        match (ty.unwrap_or("linear"), factor) {
            ("none", _) | ("linear", None) => Ok(None),
            ("linear", Some(1.0)) => Ok(None),
            ("linear", Some(f)) if f > 0.0 => Ok(Some(RopeScaling::Linear { factor: f })),
            ("yarn", Some(f)) if f > 0.0 => {
                let original = original.ok_or_else(|| {
                    self.bad("yarn rope scaling without `rope.scaling.original_context_length`".into())
                })?;
                // llama.cpp multiplies YaRN's own factor by `rope.scaling.attn_factor`.
                let attention_factor =
                    yarn_attn_factor.unwrap_or_else(|| yarn_mscale(f, 1.0)) * attn_factor.unwrap_or(1.0);
                Ok(Some(RopeScaling::Yarn {
                    factor: f,
                    original_max_position_embeddings: original,
                    beta_fast: beta_fast.unwrap_or(32.0),
                    beta_slow: beta_slow.unwrap_or(1.0),
                    attention_factor,
                    truncate: true,
                }))
            }
            (t @ ("linear" | "yarn"), f) => Err(self.bad(format!(
                "rope scaling `{t}` with factor {f:?}: expected a positive factor"
            ))),
            (other, _) => Err(self.bad(format!(
                "unsupported rope scaling `{other}` (supported: none, linear, yarn, longrope, llama3 via rope_freqs)"
            ))),
        }
    }

    fn dequantize(&self, info: &GgufTensorInfo) -> Result<HostTensor> {
        let n: usize = info.shape.iter().product();
        let mut data = vec![0f32; n];
        info.dtype.dequantize(self.tensor_bytes(info)?, &mut data);
        Ok(HostTensor::new(info.shape.clone(), data))
    }
}

impl TensorStore for GgufFile {
    fn source_name(&self) -> String {
        self.path.display().to_string()
    }

    fn format(&self) -> Format {
        Format::Gguf
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn read(&self, name: &str) -> Result<HostTensor> {
        self.dequantize(self.info(name)?)
    }

    fn read_packed(&self, name: &str) -> Result<Option<PackedTensor>> {
        let info = self.info(name)?;
        // Matrices and stacks of them (3-D `ffn_*_exps` expert tensors).
        if !info.dtype.is_quantized() || !(2..=3).contains(&info.shape.len()) {
            return Ok(None);
        }
        Ok(Some(PackedTensor {
            shape: info.shape.clone(),
            dtype: info.dtype,
            data: self.packed_bytes(info)?,
        }))
    }
}

impl GgufFile {
    fn info(&self, name: &str) -> Result<&GgufTensorInfo> {
        self.tensors
            .get(name)
            .ok_or_else(|| InferError::MissingTensor {
                name: name.to_string(),
                source_name: self.path.display().to_string(),
            })
    }
}
