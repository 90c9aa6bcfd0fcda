//! Every config.json key, and what infer does with it, by the rule GGUF metadata follows
//! (`gguf_keys`): a key is accepted when a loader read it (`HfConfig::get` records each, the
//! RoPE parameters one by one), when it cannot change the result (`INERT`), or when it holds
//! the value that leaves the model as it is (`UNREAD`); any other key is refused by name,
//! known or not. What a family reads beyond `COMMON` is its `FamilySpec::hf_keys`, and reading
//! a key outside both is a bug, reported as one.

use serde_json::Value;

use crate::error::{InferError, Result};
use crate::hf::HfConfig;
use crate::model::registry::FamilySpec;

/// Read for every family (`read_config::parse_hf_config`, `HfConfig::rope`).
pub const COMMON: &[&str] = &[
    "model_type",
    "architectures",
    "text_config",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "num_hidden_layers",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "partial_rotary_factor",
    "original_max_position_embeddings",
];

/// Keys that cannot change the result, and why.
#[rustfmt::skip]
pub const INERT: &[(&str, &str)] = &[
    ("_name_or_path", "provenance"),
    ("transformers_version", "provenance"),
    ("unsloth_version", "provenance"),
    ("auto_map", "remote-code classes; the family's own code runs"),
    ("dtype", "the weights' storage type; the backend computes in its own"),
    ("torch_dtype", "the weights' storage type; the backend computes in its own"),
    ("use_cache", "a training switch"),
    ("initializer_range", "training-time initialization"),
    ("attention_dropout", "dropout is off at inference"),
    ("hidden_dropout", "dropout is off at inference"),
    ("embd_pdrop", "dropout is off at inference"),
    ("resid_pdrop", "dropout is off at inference"),
    ("output_router_logits", "a training output"),
    ("router_aux_loss_coef", "a training loss"),
    ("router_z_loss_coef", "a training loss"),
    ("router_jitter_noise", "applied in training only"),
    ("pretraining_tp", "splits the projections into slices whose sum is the same product"),
    ("chunk_size_feed_forward", "chunks the MLP without changing it"),
    ("output_attentions", "an output switch"),
    ("output_hidden_states", "an output switch"),
    ("return_dict", "an output switch"),
    ("use_return_dict", "an output switch"),
    ("torchscript", "an export switch"),
    ("_attn_implementation", "a kernel choice"),
    ("attn_implementation", "a kernel choice"),
    ("cache_implementation", "a cache choice in transformers' generate"),
    ("id2label", "a classification head's labels"),
    ("label2id", "a classification head's labels"),
    ("problem_type", "a classification head's task"),
    ("finetuning_task", "provenance"),
    ("tokenizer_class", "the tokenizer's files decide"),
    ("bos_token_id", "the tokenizer's files decide the prompt's BOS"),
    ("pad_token_id", "generation never pads"),
    ("eos_token_id", "read with the tokenizer as a stop token"),
    ("keys_to_ignore_at_inference", "an output switch"),
    ("full_attn_mod", "Phi-4-mini's; transformers' Phi-3 does not read it"),
    ("interpolate_factor", "Phi-4-mini's; transformers' Phi-3 does not read it"),
    ("experts_per_token", "OpenAI's name; transformers reads num_experts_per_tok"),
    ("initial_context_length", "OpenAI's name; transformers reads the RoPE parameters"),
    ("max_length", "transformers' generate() length; servers take max_new_tokens"),
    ("temperature", "a generation default; infer serve applies it (generation config)"),
    ("top_p", "a generation default; infer serve applies it (generation config)"),
    ("top_k", "a generation default; infer serve applies it (generation config)"),
    ("min_p", "a generation default; infer serve applies it (generation config)"),
    ("repetition_penalty", "a generation default; infer serve applies it (generation config)"),
    ("do_sample", "a generation default; requests choose"),
];

/// Whether a value leaves the model as it is without the key.
#[derive(Debug, Clone, Copy)]
pub enum Neutral {
    /// One of these JSON values.
    Json(&'static [&'static str]),
    /// A list whose every item is this JSON value (or true, for 1).
    ListOf(&'static str),
}

/// Keys no family reads unless its `hf_keys` says so: refused unless neutral (absent and null
/// always are), with what infer computes without them.
#[rustfmt::skip]
pub const UNREAD: &[(&str, Neutral, &str)] = &[
    ("attention_bias", Neutral::Json(&["false"]), "no q/k/v biases"),
    ("mlp_bias", Neutral::Json(&["false"]), "no MLP biases"),
    ("lm_head_bias", Neutral::Json(&["false"]), "no logits bias"),
    ("hidden_act", Neutral::Json(&["\"silu\""]), "a SiLU-gated MLP"),
    ("hidden_activation", Neutral::Json(&["\"silu\""]), "a SiLU-gated MLP"),
    ("sliding_window", Neutral::Json(&[]), "every layer attends to the whole context"),
    ("use_sliding_window", Neutral::Json(&["false"]), "every layer attends to the whole context"),
    ("max_window_layers", Neutral::Json(&[]), "every layer attends to the whole context"),
    ("layer_types", Neutral::ListOf("\"full_attention\""), "every layer attends to the whole context"),
    ("sliding_window_pattern", Neutral::Json(&[]), "every layer attends to the whole context"),
    ("_sliding_window_pattern", Neutral::Json(&[]), "every layer attends to the whole context"),
    ("attention_chunk_size", Neutral::Json(&[]), "every layer attends to the whole context"),
    ("no_rope_layers", Neutral::ListOf("1"), "RoPE on every layer"),
    ("rope_local_base_freq", Neutral::Json(&[]), "sliding layers rotate like full ones"),
    ("attn_logit_softcapping", Neutral::Json(&[]), "attention scores not soft-capped"),
    ("final_logit_softcapping", Neutral::Json(&[]), "logits not soft-capped"),
    ("query_pre_attn_scalar", Neutral::Json(&[]), "softmax scale 1/√head_dim"),
    ("attention_multiplier", Neutral::Json(&[]), "softmax scale 1/√head_dim"),
    ("embedding_multiplier", Neutral::Json(&["1", "1.0"]), "embeddings unscaled"),
    ("residual_multiplier", Neutral::Json(&["1", "1.0"]), "residual branches unscaled"),
    ("logits_scaling", Neutral::Json(&["1", "1.0"]), "logits unscaled"),
    ("use_qk_norm", Neutral::Json(&["false"]), "no q/k norms"),
    ("qk_layernorm", Neutral::Json(&["false"]), "no q/k norms"),
    ("use_parallel_residual", Neutral::Json(&["false"]), "sequential attention then MLP"),
    ("clip_qkv", Neutral::Json(&[]), "q, k and v unclamped"),
    ("use_bidirectional_attention", Neutral::Json(&["false"]), "causal attention"),
    ("is_encoder_decoder", Neutral::Json(&["false"]), "a decoder-only model"),
    ("add_cross_attention", Neutral::Json(&["false"]), "a decoder-only model"),
    ("pruned_heads", Neutral::Json(&["{}"]), "every head present"),
    ("num_experts", Neutral::Json(&["0"]), "a dense MLP"),
    ("num_local_experts", Neutral::Json(&["0"]), "a dense MLP"),
    ("num_experts_per_tok", Neutral::Json(&[]), "a dense MLP"),
    ("moe_intermediate_size", Neutral::Json(&[]), "a dense MLP"),
    ("norm_topk_prob", Neutral::Json(&[]), "a dense MLP"),
    ("decoder_sparse_step", Neutral::Json(&[]), "a dense MLP"),
    ("mlp_only_layers", Neutral::ListOf("0"), "a dense MLP"),
    ("swiglu_alpha", Neutral::Json(&[]), "the family's own MLP activation"),
    ("swiglu_limit", Neutral::Json(&[]), "the family's own MLP activation"),
    ("num_nextn_predict_layers", Neutral::Json(&["0"]), "no MTP layers"),
    ("quantization_config", Neutral::Json(&[]), "unquantized weights"),
];

fn is_neutral(neutral: Neutral, value: &Value) -> bool {
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
    let same = |a: &Value, b: &Value| match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    };
    match neutral {
        Neutral::Json(list) => list.iter().any(|s| same(value, &parse(s))),
        Neutral::ListOf(item) => {
            let item = parse(item);
            value.as_array().is_some_and(|a| {
                a.iter()
                    .all(|x| same(x, &item) || (item == 1 && *x == Value::Bool(true)))
            })
        }
    }
}

/// A value as an error message shows it (long lists and objects by size).
fn shown(v: &Value) -> String {
    let text = v.to_string();
    match v {
        Value::Array(a) if text.len() > 240 => format!("a list of {} items", a.len()),
        Value::Object(m) if text.len() > 240 => format!("an object of {} keys", m.len()),
        _ => text,
    }
}

impl HfConfig {
    /// After the family read its features: refuses every key nothing read that can change
    /// the result and is not neutral; fails on a read `spec` does not declare (a bug).
    pub(crate) fn check_keys(&self, spec: &FamilySpec) -> Result<()> {
        let read = self.keys_read();
        let top_level = |k: &str| k.split('.').next().unwrap_or(k).to_string();
        for key in read.iter().map(|k| top_level(k)) {
            let declared = COMMON.contains(&key.as_str())
                || spec.hf_keys.contains(&key.as_str())
                || INERT.iter().any(|(k, _)| *k == key);
            if !declared && !key.is_empty() {
                return Err(InferError::Config(format!(
                    "internal: the {} loader read config.json key `{key}`, which neither the \
                     common keys nor its hf_keys list (core/src/model/hf_keys.rs)",
                    spec.name
                )));
            }
        }
        let refuse = |key: &str, value: &Value, why: String| {
            Err(self.bad(format!(
                "`{key}` = {} {why}; refusing rather than computing something other than the \
                 model the config describes",
                shown(value)
            )))
        };
        for (key, value) in &self.raw {
            if value.is_null() {
                continue;
            }
            if key == "rope_parameters" || key == "rope_scaling" {
                self.check_rope_keys(key, value, spec, &read)?;
                continue;
            }
            if read.contains(key) || INERT.iter().any(|(k, _)| k == key) {
                continue;
            }
            match UNREAD.iter().find(|(k, _, _)| k == key) {
                Some((_, neutral, _)) if is_neutral(*neutral, value) => {}
                Some((_, _, note)) => {
                    return refuse(
                        key,
                        value,
                        format!(
                            "is not read by infer's {} loader (without it: {note})",
                            spec.name
                        ),
                    )
                }
                None => return refuse(key, value, "is not a config key infer knows".into()),
            }
        }
        Ok(())
    }

    /// Every RoPE parameter (per layer type where nested) must have been read.
    fn check_rope_keys(
        &self,
        key: &str,
        value: &Value,
        spec: &FamilySpec,
        read: &std::collections::BTreeSet<String>,
    ) -> Result<()> {
        let Value::Object(top) = value else {
            return Ok(()); // `HfConfig::rope` refused it already
        };
        let mut params: Vec<(String, &Value)> = Vec::new();
        for (name, v) in top {
            match (name.as_str(), v) {
                ("full_attention" | "sliding_attention", Value::Object(inner)) => {
                    params.extend(inner.iter().map(|(k, v)| (format!("{key}.{name}.{k}"), v)))
                }
                _ => params.push((format!("{key}.{name}"), v)),
            }
        }
        for (path, v) in params {
            if v.is_null() || read.contains(&path) {
                continue;
            }
            let layer_type = path.split('.').nth(1).unwrap_or_default();
            let why = if matches!(layer_type, "full_attention" | "sliding_attention") {
                format!(
                    "is not read by infer's {} loader ({layer_type} layers' RoPE)",
                    spec.name
                )
            } else {
                format!("is not read by infer's {} loader", spec.name)
            };
            return Err(self.bad(format!(
                "`{path}` = {} {why}; refusing rather than computing something other than the \
                 model the config describes",
                shown(v)
            )));
        }
        Ok(())
    }
}
