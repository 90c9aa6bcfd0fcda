//! A GGUF's recommended sampling (`general.sampling.*`, which llama.cpp's converter copies from
//! the model's generation_config.json) in generation_config.json's own names, so a server's
//! `--generation-config auto` treats both alike. A recommendation infer's sampler cannot follow
//! is refused by name rather than dropped.

use serde_json::{Map, Value};

use super::GgufFile;
use crate::error::Result;

/// `general.sampling.*` keys infer follows, with their generation_config.json names.
const FOLLOWED: &[(&str, &str)] = &[
    ("temp", "temperature"),
    ("top_k", "top_k"),
    ("top_p", "top_p"),
    ("min_p", "min_p"),
    ("penalty_repeat", "repetition_penalty"),
];

impl GgufFile {
    /// The file's sampling recommendations as a generation config (empty when it has none).
    pub fn sampling_defaults(&self) -> Result<Map<String, Value>> {
        let key = |k: &str| format!("general.sampling.{k}");
        let mut out = Map::new();
        for (name, hf) in FOLLOWED {
            let value = match *hf {
                // An integer in the file (llama.cpp writes top_k as i32).
                "top_k" => self
                    .get(&key(name))
                    .map(|v| v.as_i64().map_or(Value::Null, Value::from)),
                _ => self
                    .meta_f64(&key(name))?
                    .map(|v| serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)),
            };
            match value {
                None => {}
                Some(Value::Null) => {
                    return Err(self.bad(format!("metadata `{}` is not a number", key(name))))
                }
                Some(v) => {
                    out.insert((*hf).to_string(), v);
                }
            }
        }
        let number = |k: &str| self.meta_f64(&key(k));
        let mirostat = number("mirostat")?.unwrap_or(0.0);
        let xtc = number("xtc_probability")?.unwrap_or(0.0);
        let penalty = number("penalty_repeat")?.unwrap_or(1.0);
        // llama.cpp: -1 (an i32) is the whole context, which is vLLM's (and infer's) reach.
        let last_n = number("penalty_last_n")?.unwrap_or(-1.0);
        let refuse = |k: &str, why: &str| {
            Err(self.bad(format!(
                "metadata `{}` {why}: infer's sampler cannot follow this recommendation (serve with --generation-config vllm to leave the file's sampling defaults aside)",
                key(k)
            )))
        };
        if mirostat != 0.0 {
            return refuse("mirostat", "asks for Mirostat sampling");
        }
        if xtc != 0.0 {
            return refuse("xtc_probability", "asks for XTC sampling");
        }
        if penalty != 1.0 && last_n != -1.0 {
            return refuse(
                "penalty_last_n",
                "limits the repetition penalty to the last tokens (infer's covers the whole sequence)",
            );
        }
        if self.get(&key("sequence")).is_some() {
            return refuse("sequence", "orders the samplers");
        }
        // Parameters of the samplers above that are off: they change nothing.
        for k in ["mirostat_tau", "mirostat_eta", "xtc_threshold"] {
            self.get(&key(k));
        }
        Ok(out)
    }
}
