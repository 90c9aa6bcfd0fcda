//! Server-wide defaults for what a request leaves out, as vLLM takes them: the sampling
//! fields of the model's `generation_config.json` (`--generation-config auto`, the default)
//! with `--override-generation-config` over them, and `--default-chat-template-kwargs`.

use infer_core::narrow::f32_of;
use serde_json::{Map, Value};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// `max_new_tokens`: every request's output is capped at it (vLLM's reading), and it is
    /// the length of a request that sets none.
    pub max_tokens: Option<usize>,
    /// Template variables under every chat request's own `chat_template_kwargs`.
    pub chat_template_kwargs: Map<String, Value>,
}

impl RequestDefaults {
    /// No defaults: every field left out takes OpenAI's default.
    pub fn none() -> &'static RequestDefaults {
        static NONE: std::sync::OnceLock<RequestDefaults> = std::sync::OnceLock::new();
        NONE.get_or_init(RequestDefaults::default)
    }

    /// The fields vLLM takes from a generation config (`repetition_penalty`, `temperature`,
    /// `top_k`, `top_p`, `min_p`, `max_new_tokens`) over `self`; other keys (`do_sample`,
    /// `bos_token_id`, ...) are left alone. A field of the wrong type is an error naming it.
    pub fn with_generation_config(mut self, config: &Map<String, Value>) -> Result<Self, String> {
        let float = |k: &str| -> Result<Option<f32>, String> {
            match config.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(|x| Some(f32_of(x)))
                    .ok_or_else(|| format!("`{k}` is not a number: {v}")),
            }
        };
        let int = |k: &str| -> Result<Option<i64>, String> {
            match config.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_i64()
                    .map(Some)
                    .ok_or_else(|| format!("`{k}` is not an integer: {v}")),
            }
        };
        self.temperature = float("temperature")?.or(self.temperature);
        self.top_p = float("top_p")?.or(self.top_p);
        self.min_p = float("min_p")?.or(self.min_p);
        self.repetition_penalty = float("repetition_penalty")?.or(self.repetition_penalty);
        self.top_k = int("top_k")?.or(self.top_k);
        if let Some(m) = int("max_new_tokens")? {
            let m = usize::try_from(m)
                .ok()
                .filter(|&m| m > 0)
                .ok_or_else(|| format!("`max_new_tokens` must be at least 1, not {m}"))?;
            self.max_tokens = Some(m);
        }
        Ok(self)
    }

    /// A request's output length: its own (or `fallback`) under the `max_new_tokens` cap.
    pub fn max_tokens(&self, asked: Option<usize>, fallback: Option<usize>) -> Option<usize> {
        match (asked.or(fallback), self.max_tokens) {
            (Some(m), Some(cap)) => Some(m.min(cap)),
            (None, cap) => cap,
            (m, None) => m,
        }
    }

    /// The sampling defaults in force, `key=value` joined (for the start-up log); `None`
    /// when there are none.
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                parts.push(format!("{k}={v}"));
            }
        };
        add("temperature", self.temperature.map(|v| v.to_string()));
        add("top_p", self.top_p.map(|v| v.to_string()));
        add("top_k", self.top_k.map(|v| v.to_string()));
        add("min_p", self.min_p.map(|v| v.to_string()));
        add(
            "repetition_penalty",
            self.repetition_penalty.map(|v| v.to_string()),
        );
        add("max_new_tokens", self.max_tokens.map(|v| v.to_string()));
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generation_config_fields_are_read_and_overridden_and_typed() {
        let model = json!({"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
            "max_new_tokens": 64, "bos_token_id": 1});
        let d = RequestDefaults::default()
            .with_generation_config(model.as_object().unwrap())
            .unwrap()
            .with_generation_config(json!({"temperature": 0.2}).as_object().unwrap())
            .unwrap();
        assert_eq!(d.temperature, Some(0.2));
        assert_eq!(d.top_p, Some(0.95));
        assert_eq!(d.top_k, Some(20));
        assert_eq!(d.max_tokens(Some(100), None), Some(64));
        assert_eq!(d.max_tokens(None, Some(16)), Some(16));
        assert_eq!(d.max_tokens(None, None), Some(64));
        let err = RequestDefaults::default()
            .with_generation_config(json!({"top_p": "high"}).as_object().unwrap())
            .unwrap_err();
        assert!(err.contains("top_p"), "{err}");
    }
}
