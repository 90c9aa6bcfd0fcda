//! What every handler shares: the engine handle, the tokenizer, the served model's name and
//! limits, and request ids.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use infer_core::{FinishReason, Tokenizer};
use warp::http::StatusCode;

use crate::api::PromptInput;
use crate::engine_loop::EngineHandle;
use crate::errors::ApiError;
use crate::metrics::Metrics;

pub struct ServerState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub model_name: String,
    pub max_model_len: usize,
    pub backend: String,
    pub metrics: Arc<Metrics>,
    next_id: AtomicU64,
    pub started: u64,
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

impl ServerState {
    pub fn new(
        engine: EngineHandle,
        tokenizer: Arc<Tokenizer>,
        model_name: String,
        max_model_len: usize,
        backend: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        ServerState {
            engine,
            tokenizer,
            model_name,
            max_model_len,
            backend,
            metrics,
            next_id: AtomicU64::new(0),
            started: unix_now(),
        }
    }

    /// A fresh request id with OpenAI's prefix (`cmpl`, `chatcmpl`).
    pub fn request_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.started)
    }

    /// 404 for a model name this server does not serve (absent = the served one).
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.model_name => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model `{m}` does not exist; this server serves `{}`",
                    self.model_name
                ),
            )
            .param("model")),
            _ => Ok(()),
        }
    }

    /// Token ids of each prompt.
    pub fn encode_prompts(&self, prompt: &PromptInput) -> Result<Vec<Vec<u32>>, ApiError> {
        let encode = |t: &str| self.tokenizer.encode(t, true).map_err(ApiError::from);
        let prompts = match prompt {
            PromptInput::Text(t) => vec![encode(t)?],
            PromptInput::Texts(ts) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
            PromptInput::Tokens(ids) => vec![ids.clone()],
            PromptInput::TokenLists(l) => l.clone(),
        };
        if prompts.is_empty() {
            return Err(ApiError::bad_request("`prompt` is empty").param("prompt"));
        }
        Ok(prompts)
    }

    /// `max_tokens` checked against the context: prompt + max_tokens must fit (vLLM's rule).
    pub fn check_length(
        &self,
        prompt_len: usize,
        max_tokens: Option<usize>,
    ) -> Result<(), ApiError> {
        let max = self.max_model_len;
        if prompt_len >= max {
            return Err(ApiError::bad_request(format!(
                "the prompt has {prompt_len} tokens but the model's context is {max} tokens"
            ))
            .param("prompt"));
        }
        if let Some(m) = max_tokens {
            if prompt_len + m > max {
                return Err(ApiError::bad_request(format!(
                    "prompt ({prompt_len} tokens) + max_tokens ({m}) exceeds the model's context of {max} tokens"
                ))
                .param("max_tokens"));
            }
        }
        Ok(())
    }
}
