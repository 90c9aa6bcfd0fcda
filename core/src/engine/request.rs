//! What goes into the engine and what comes out of it, per request.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::generate::{FinishReason, GenerationParams};
use crate::sampler::Sampler;
use crate::tokenizer::IncrementalDetokenizer;

/// A prompt as text (tokenized by the engine) or as token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

impl From<&str> for Prompt {
    fn from(s: &str) -> Self {
        Prompt::Text(s.to_string())
    }
}

impl From<String> for Prompt {
    fn from(s: String) -> Self {
        Prompt::Text(s)
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(t: Vec<u32>) -> Self {
        Prompt::Tokens(t)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestMetrics {
    pub arrival: Instant,
    /// When its first tokens entered a step.
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub finished: Option<Instant>,
    pub num_prompt_tokens: usize,
    pub num_output_tokens: usize,
    /// Times it was preempted (by recompute or swap).
    pub num_preemptions: usize,
}

impl RequestMetrics {
    /// Time to first token.
    pub fn ttft(&self) -> Option<Duration> {
        Some(self.first_token? - self.arrival)
    }

    /// Arrival to finish.
    pub fn latency(&self) -> Option<Duration> {
        Some(self.finished? - self.arrival)
    }
}

/// What one step did for one request.
#[derive(Debug, Clone)]
pub struct RequestOutput {
    pub request_id: String,
    /// Tokens sampled this step (a stop token included).
    pub new_token_ids: Vec<u32>,
    /// Newly completed text (empty without a tokenizer, or while a character is incomplete).
    pub text_delta: String,
    /// Set on the request's last output.
    pub finish_reason: Option<FinishReason>,
    pub metrics: RequestMetrics,
}

impl RequestOutput {
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }
}

/// A finished request, from the offline API.
#[derive(Debug, Clone, Serialize)]
pub struct CompletedRequest {
    pub request_id: String,
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    #[serde(skip)]
    pub metrics: RequestMetrics,
}

/// The engine's per-request state beside the scheduler's.
pub(crate) struct Request {
    pub id: String,
    pub params: GenerationParams,
    pub sampler: Sampler,
    pub detokenizer: Option<IncrementalDetokenizer>,
    pub prompt_len: usize,
    /// Prompt plus output can grow to this many tokens.
    pub max_len: usize,
    pub metrics: RequestMetrics,
}
