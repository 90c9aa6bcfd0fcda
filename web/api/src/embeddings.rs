//! `POST /v1/embeddings` (OpenAI's, with vLLM's extras): the request, its checks, and the
//! reply. The vectors come from a pooling engine (`infer serve --runner pooling`).

use base64::Engine as _;
use infer_core::{EmbedParams, PoolingType};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::RequestError;
use crate::format::Reply;
use crate::prepare::Served;
use crate::types::PromptInput;

/// Inputs one request may embed (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// How the vectors are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    /// JSON numbers.
    #[default]
    Float,
    /// The little-endian f32 bytes, base64 (what the openai clients ask for by default).
    Base64,
}

/// The body of `POST /v1/embeddings`. A field not listed is refused by name.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    /// A string, strings, token ids, or lists of token ids: one vector each.
    pub input: PromptInput,
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    /// Keep the first this many components, then normalize (OpenAI's; any model here).
    pub dimensions: Option<usize>,
    /// Has no effect on the result (OpenAI's end-user id).
    pub user: Option<String>,
    /// vLLM: keep each input's last this many tokens (-1: as many as the context holds).
    pub truncate_prompt_tokens: Option<i64>,
    /// vLLM: add the tokenizer's special tokens (BOS) to a text input (default true).
    pub add_special_tokens: Option<bool>,
    /// vLLM: scale to unit length (default: the server's `--pooler-config`, normally true).
    pub normalize: Option<bool>,
    /// vLLM: the reply's id becomes `embd-{request_id}`.
    pub request_id: Option<String>,
}

/// An embedding request ready for the engine.
#[derive(Debug)]
pub struct PreparedEmbedding {
    pub inputs: Vec<Vec<u32>>,
    pub params: EmbedParams,
    pub base64: bool,
}

impl Served<'_> {
    /// Checks and tokenizes an embedding request; `pooler` is the server's pooling.
    pub fn embedding(
        &self,
        req: &EmbeddingRequest,
        pooler: EmbedParams,
    ) -> Result<PreparedEmbedding, RequestError> {
        self.check_model(req.model.as_deref())?;
        let bad = |m: String| RequestError::bad_request(m).param("input");
        let count = match &req.input {
            PromptInput::Texts(t) => t.len(),
            PromptInput::TokenLists(l) => l.len(),
            _ => 1,
        };
        if count > MAX_INPUTS {
            return Err(bad(format!(
                "{count} inputs; at most {MAX_INPUTS} per request"
            )));
        }
        let mut inputs = self
            .encode_prompts(&req.input, req.add_special_tokens.unwrap_or(true))
            .map_err(|e| e.param("input"))?;
        for (i, p) in inputs.iter_mut().enumerate() {
            self.truncate(p, req.truncate_prompt_tokens)?;
            if p.is_empty() {
                return Err(bad(format!("input {i} is empty")));
            }
            if p.len() > self.max_model_len {
                return Err(bad(format!(
                    "input {i} has {} tokens but the model's context is {} tokens",
                    p.len(),
                    self.max_model_len
                ))
                .code("context_length_exceeded"));
            }
        }
        let params = EmbedParams {
            pooling: pooler.pooling,
            normalize: req.normalize.unwrap_or(pooler.normalize),
            dimensions: req.dimensions,
        };
        if params.dimensions == Some(0) {
            return Err(
                RequestError::bad_request("`dimensions` must be at least 1").param("dimensions")
            );
        }
        Ok(PreparedEmbedding {
            inputs,
            params,
            base64: req.encoding_format == EncodingFormat::Base64,
        })
    }
}

/// The reply: OpenAI's list of `embedding` objects, in input order, with the prompt tokens
/// as usage.
pub fn embedding_reply(
    reply: &Reply,
    vectors: &[Vec<f32>],
    prompt_tokens: usize,
    base64: bool,
) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    json!({
        "id": reply.id,
        "object": "list",
        "created": reply.created,
        "model": reply.model,
        "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

/// The pooling a `--pooler-config` JSON asks for (vLLM's keys `pooling_type` and
/// `normalize`; any other key is refused by name, since it would change the result).
pub fn parse_pooler_config(text: &str) -> Result<EmbedParams, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not a JSON object: {e}"))?;
    let Value::Object(map) = value else {
        return Err("not a JSON object".into());
    };
    let mut params = EmbedParams::default();
    for (key, v) in map {
        match (key.as_str(), &v) {
            ("pooling_type", Value::String(s)) => {
                params.pooling = s.parse::<PoolingType>().map_err(|e| e.to_string())?;
            }
            ("normalize", Value::Bool(b)) => params.normalize = *b,
            ("pooling_type" | "normalize", _) => {
                return Err(format!("`{key}` has the wrong type ({v})"))
            }
            _ => {
                return Err(format!(
                    "`{key}` is not supported (infer takes pooling_type and normalize)"
                ))
            }
        }
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooler_config_keys() {
        let p = parse_pooler_config(r#"{"pooling_type": "mean", "normalize": false}"#).unwrap();
        assert_eq!((p.pooling, p.normalize), (PoolingType::Mean, false));
        assert_eq!(parse_pooler_config("{}").unwrap(), EmbedParams::default());
        let e = parse_pooler_config(r#"{"softmax": true}"#).unwrap_err();
        assert!(e.contains("softmax"), "{e}");
        assert!(parse_pooler_config(r#"{"pooling_type": "STEP"}"#).is_err());
        assert!(parse_pooler_config(r#"{"normalize": 1}"#).is_err());
        assert!(parse_pooler_config("[1]").is_err());
    }

    #[test]
    fn base64_is_little_endian_f32() {
        let reply = Reply {
            id: "embd-1".into(),
            created: 0,
            model: "m".into(),
        };
        let v = embedding_reply(&reply, &[vec![1.0, -2.5]], 3, true);
        let text = v["data"][0]["embedding"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap();
        let back: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(back, [1.0, -2.5]);
        assert_eq!(v["usage"]["prompt_tokens"], 3);
        let plain = embedding_reply(&reply, &[vec![0.5]], 1, false);
        assert_eq!(plain["data"][0]["embedding"], json!([0.5]));
    }
}
