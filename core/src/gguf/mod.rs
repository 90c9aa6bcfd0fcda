//! GGUF models: config from metadata, weights dequantized on load, tokenizer from metadata.

mod dtype;
pub mod kquants;
mod reader;

pub use dtype::GgmlType;
pub use reader::{GgufFile, GgufTensorInfo, GgufValue};

use crate::config::{ModelConfig, RopeScaling, RopeStyle};
use crate::error::{InferError, Result};
use crate::weights::{HostTensor, LayerWeight, PackedTensor, WeightName, WeightSource};

impl GgufFile {
    fn arch_key(&self, key: &str) -> String {
        let arch = self
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or("llama");
        format!("{arch}.{key}")
    }

    fn meta_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.bad(format!("metadata `{key}` is {v:?}, expected an integer"))),
        }
    }

    fn require_usize(&self, key: &str) -> Result<usize> {
        self.meta_usize(key)?
            .ok_or_else(|| self.bad(format!("metadata `{key}` is missing")))
    }

    fn meta_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(format!("metadata `{key}` is {v:?}, expected a number"))),
        }
    }

    fn bad(&self, reason: String) -> InferError {
        InferError::Gguf {
            path: self.path.clone(),
            reason,
        }
    }

    /// Reads the model configuration from the metadata.
    pub fn model_config(&self) -> Result<ModelConfig> {
        let arch = self
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| self.bad("metadata `general.architecture` is missing".into()))?
            .to_string();
        let rope_style = match arch.as_str() {
            "llama" | "mistral" => RopeStyle::AdjacentPairs,
            "qwen2" => RopeStyle::HalfSplit,
            _ => return Err(InferError::UnsupportedArchitecture(arch)),
        };
        let k = |s: &str| self.arch_key(s);
        let hidden = self.require_usize(&k("embedding_length"))?;
        let heads = self.require_usize(&k("attention.head_count"))?;
        let kv_heads = self
            .meta_usize(&k("attention.head_count_kv"))?
            .unwrap_or(heads);
        let head_dim = match self.meta_usize(&k("attention.key_length"))? {
            Some(d) => d,
            None if heads > 0 => hidden / heads,
            None => 0,
        };
        let vocab = match self.meta_usize(&k("vocab_size"))? {
            Some(v) => v,
            None => self
                .get("tokenizer.ggml.tokens")
                .and_then(|t| t.as_array())
                .map(|t| t.len())
                .ok_or_else(|| self.bad("no vocab_size and no tokenizer.ggml.tokens".into()))?,
        };
        let rope_scaling = self.rope_scaling()?;
        let config = ModelConfig {
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: self.require_usize(&k("feed_forward_length"))?,
            num_layers: self.require_usize(&k("block_count"))?,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            rms_norm_eps: self
                .meta_f64(&k("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5) as f32,
            rope_theta: self.meta_f64(&k("rope.freq_base"))?.unwrap_or(10000.0),
            rope_scaling,
            rope_style,
            max_position_embeddings: self.require_usize(&k("context_length"))?,
            tie_word_embeddings: !self.tensors.contains_key("output.weight"),
            attention_bias: self.tensors.contains_key("blk.0.attn_q.bias"),
            architecture: arch,
        };
        config.validate()?;
        Ok(config)
    }

    fn rope_scaling(&self) -> Result<Option<RopeScaling>> {
        if let Some(info) = self.tensors.get("rope_freqs.weight") {
            let t = self.dequantize(info)?;
            return Ok(Some(RopeScaling::FreqFactors(t.data)));
        }
        let ty = self
            .get(&self.arch_key("rope.scaling.type"))
            .and_then(|v| v.as_str());
        let factor = self.meta_f64(&self.arch_key("rope.scaling.factor"))?;
        match (ty, factor) {
            (None | Some("none"), _) => Ok(None),
            (Some("linear"), Some(f)) if f > 0.0 => Ok(Some(RopeScaling::Linear { factor: f })),
            (Some(other), _) => Err(self.bad(format!(
                "unsupported rope scaling `{other}` (supported: linear, llama3 via rope_freqs)"
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

impl GgufFile {
    fn info(&self, w: WeightName) -> Result<&GgufTensorInfo> {
        let name = self.tensor_name(w);
        self.tensors
            .get(&name)
            .ok_or_else(|| InferError::MissingTensor {
                name,
                source_name: self.source_name(),
            })
    }
}

impl WeightSource for GgufFile {
    fn source_name(&self) -> String {
        self.path.display().to_string()
    }

    fn tensor_name(&self, w: WeightName) -> String {
        match w {
            WeightName::Embed => "token_embd.weight".into(),
            WeightName::FinalNorm => "output_norm.weight".into(),
            WeightName::LmHead => "output.weight".into(),
            WeightName::Layer(i, lw) => {
                let s = match lw {
                    LayerWeight::AttnNorm => "attn_norm.weight",
                    LayerWeight::Q => "attn_q.weight",
                    LayerWeight::K => "attn_k.weight",
                    LayerWeight::V => "attn_v.weight",
                    LayerWeight::QBias => "attn_q.bias",
                    LayerWeight::KBias => "attn_k.bias",
                    LayerWeight::VBias => "attn_v.bias",
                    LayerWeight::O => "attn_output.weight",
                    LayerWeight::FfnNorm => "ffn_norm.weight",
                    LayerWeight::Gate => "ffn_gate.weight",
                    LayerWeight::Up => "ffn_up.weight",
                    LayerWeight::Down => "ffn_down.weight",
                };
                format!("blk.{i}.{s}")
            }
        }
    }

    fn contains(&self, w: WeightName) -> bool {
        self.tensors.contains_key(&self.tensor_name(w))
    }

    fn load_raw(&self, w: WeightName) -> Result<HostTensor> {
        self.dequantize(self.info(w)?)
    }

    fn load_packed_raw(&self, w: WeightName) -> Result<Option<PackedTensor>> {
        let info = self.info(w)?;
        if !info.dtype.is_quantized() || info.shape.len() != 2 {
            return Ok(None);
        }
        Ok(Some(PackedTensor {
            shape: info.shape.clone(),
            dtype: info.dtype,
            data: self.packed_bytes(info)?,
        }))
    }
}
