//! From a checkpoint's metadata to a `ModelConfig`: the registry names the family, the
//! format's common keys are read here, and the family reads its own (`FamilySpec`'s
//! `gguf_features` / `hf_features`). It sits above the file formats and the registry, so neither
//! format calls up into the families.

use std::path::Path;

use serde_json::Value;

use super::registry;
use crate::config::{Features, ModelConfig};
use crate::error::{InferError, Result};
use crate::gguf::{GgufFile, CONFIG_TENSORS};
use crate::hf::HfConfig;
use crate::narrow::f32_of;
use crate::rope::{Rope, RopeStyle};
use crate::tokenizer::Tokenizer;

/// Everything read from a GGUF file's header before its tensors: the metadata and tensor
/// table, the model configuration and the tokenizer, from bytes that may be anything. The fuzz
/// target (`core/fuzz`) and its replayed corpus drive this: it must return, never panic, loop
/// or allocate by a size the bytes merely claim.
pub fn read_untrusted(bytes: &[u8]) -> Result<(ModelConfig, Tokenizer)> {
    let mut file =
        GgufFile::from_header("untrusted.gguf", bytes, bytes.len() as u64)?.ok_or_else(|| {
            InferError::Gguf {
                path: "untrusted.gguf".into(),
                reason: "the header runs past the end of the file".into(),
            }
        })?;
    for name in CONFIG_TENSORS {
        if let Some(info) = file.tensors.get(name) {
            let (a, b) = GgufFile::tensor_range(info);
            let range = usize::try_from(a).and_then(|a| Ok(a..usize::try_from(b)?));
            let kept = range
                .ok()
                .and_then(|r| bytes.get(r))
                .ok_or_else(|| InferError::Gguf {
                    path: "untrusted.gguf".into(),
                    reason: format!(
                        "tensor `{name}` lies outside the {} bytes read",
                        bytes.len()
                    ),
                })?;
            let kept = kept.to_vec();
            file.keep_tensor(name, kept)?;
        }
    }
    file.read_model()
}

/// The values of `general.type` that are a model (llama.cpp writes `model`; old files none).
const MODEL_TYPES: &[&str] = &["model"];

/// The block layout of ggml's quantized types that infer reads (`GGML_QNT_VERSION`).
const QUANTIZATION_VERSION: u64 = 2;

impl GgufFile {
    /// The model configuration and tokenizer, with every metadata key accounted for: read, or
    /// unable to change the result (`model::gguf_keys`).
    pub fn read_model(&self) -> Result<(ModelConfig, Tokenizer)> {
        let config = self.model_config()?;
        let tokenizer = Tokenizer::from_gguf(self)?;
        self.check_keys(config.family)?;
        Ok((config, tokenizer))
    }

    /// What kind of file this is, before anything is read as a model's: `general.type` a model
    /// and the quantized blocks in the layout infer reads.
    fn check_file_kind(&self) -> Result<()> {
        match self.get("general.type") {
            None => {}
            Some(v) if v.as_str().is_some_and(|t| MODEL_TYPES.contains(&t)) => {}
            Some(v) => {
                return Err(self.bad(format!(
                    "general.type is {}: not a model (a LoRA adapter or projector is loaded beside its model, not as one)",
                    v.as_str().map_or_else(|| v.describe(), |t| format!("`{t}`"))
                )))
            }
        }
        match self.meta_usize("general.quantization_version")? {
            Some(v) if v as u64 != QUANTIZATION_VERSION => Err(self.bad(format!(
                "general.quantization_version is {v}: quantized with ggml's older block layout; infer reads version {QUANTIZATION_VERSION} (requantize the model with a current llama-quantize)"
            ))),
            _ => Ok(()),
        }
    }

    /// Reads the model configuration from the metadata: the common keys here, the family's
    /// own in its `gguf_features`.
    pub(crate) fn model_config(&self) -> Result<ModelConfig> {
        self.check_file_kind()?;
        let arch = self
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| self.bad("metadata `general.architecture` is missing".into()))?
            .to_string();
        let k = |s: &str| self.arch_key(s);
        let experts = self.meta_usize(&k("expert_count"))?;
        let spec = registry::by_gguf(&arch, experts.map(|n| n as u64))?;
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
        // Values as wide as keys, and sliding layers' heads as wide as full ones'.
        self.require_equal("attention.value_length", head_dim, "the key width")?;
        self.require_equal("attention.key_length_swa", head_dim, "the key width")?;
        self.require_equal("attention.value_length_swa", head_dim, "the key width")?;
        let vocab = match self.meta_usize(&k("vocab_size"))? {
            Some(v) => v,
            None => self
                .get("tokenizer.ggml.tokens")
                .and_then(|t| t.as_array())
                .map(|t| t.len())
                .ok_or_else(|| self.bad("no vocab_size and no tokenizer.ggml.tokens".into()))?,
        };
        let max_pos = self.require_usize(&k("context_length"))?;
        let rope = Rope {
            theta: self.meta_f64(&k("rope.freq_base"))?.unwrap_or(10000.0),
            scaling: self.rope_scaling(max_pos)?,
            rotary_dim: self
                .meta_usize(&k("rope.dimension_count"))?
                .unwrap_or(head_dim),
        };
        self.require_equal(
            "rope.dimension_count_swa",
            rope.rotary_dim,
            "the rotary width",
        )?;
        let mut config = ModelConfig {
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: self.require_usize(&k("feed_forward_length"))?,
            num_layers: self.require_usize(&k("block_count"))?,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            rms_norm_eps: f32_of(
                self.meta_f64(&k("attention.layer_norm_rms_epsilon"))?
                    .unwrap_or(1e-5),
            ),
            rope,
            rope_style: spec.gguf_rope_style,
            max_position_embeddings: max_pos,
            tie_word_embeddings: !self.tensors.contains_key("output.weight"),
            attention_bias: self.tensors.contains_key("blk.0.attn_q.bias"),
            architecture: spec.name.to_string(),
            family: spec.family,
            features: Features::default(),
        };
        // Sizes first, before the family's features build anything per layer.
        config.check_limits().map_err(|e| match e {
            InferError::Config(m) => self.bad(m),
            other => other,
        })?;
        self.check_layers_present(config.num_layers)?;
        (spec.gguf_features)(self, &mut config)?;
        config.validate().map_err(|e| match e {
            InferError::Config(m) => self.bad(m),
            other => other,
        })?;
        Ok(config)
    }
}

/// Reads a Hugging Face `config.json`.
pub fn parse_hf_config(path: &Path) -> Result<ModelConfig> {
    let hf = HfConfig::open(path)?;
    if hf.get("text_config").is_some() {
        return Err(hf.bad(
            "a multimodal checkpoint (`text_config`); only text models are supported: use the text model's own checkpoint",
        ));
    }
    let architectures: Vec<String> = hf
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let spec = registry::by_hf(hf.str("model_type")?, &architectures)?;
    let hidden = hf.require_usize("hidden_size")?;
    let heads = hf.require_usize("num_attention_heads")?;
    let head_dim = match hf.usize("head_dim")? {
        Some(d) => d,
        None => hidden / heads.max(1),
    };
    let max_pos = hf.require_usize("max_position_embeddings")?;
    let mut config = ModelConfig {
        architecture: spec.name.to_string(),
        family: spec.family,
        vocab_size: hf.require_usize("vocab_size")?,
        hidden_size: hidden,
        intermediate_size: hf.require_usize("intermediate_size")?,
        num_layers: hf.require_usize("num_hidden_layers")?,
        num_heads: heads,
        num_kv_heads: hf.usize("num_key_value_heads")?.unwrap_or(heads),
        head_dim,
        rms_norm_eps: f32_of(hf.f64("rms_norm_eps")?.unwrap_or(1e-6)),
        rope: hf.rope("full_attention", head_dim, max_pos)?,
        rope_style: RopeStyle::HalfSplit,
        max_position_embeddings: max_pos,
        tie_word_embeddings: hf.bool("tie_word_embeddings")?.unwrap_or(false),
        attention_bias: false,
        features: Features::default(),
    };
    (spec.hf_features)(&hf, &mut config)?;
    hf.check_keys(spec)?;
    config.validate().map_err(|e| match e {
        InferError::Config(m) => hf.bad(m),
        other => other,
    })?;
    Ok(config)
}
