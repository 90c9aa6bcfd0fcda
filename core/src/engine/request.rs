//! What goes into the engine and what comes out of it, per request.

use std::time::Duration;

use web_time::Instant;

use rand::rngs::StdRng;
use serde::Serialize;

use llguidance::Matcher;

use super::finish::FinishReason;
use crate::block_manager::SeqId;
use crate::sampling::{OutputText, SamplingParams};
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
    /// Prompt tokens served from the prefix cache at its first admission (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`); `None` until admitted.
    pub num_cached_tokens: Option<usize>,
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

/// What ended a sequence besides EOS: a stop token id or a stop string (vLLM's `stop_reason`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum StopReason {
    Token(u32),
    String(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TopLogprob {
    pub token_id: u32,
    pub logprob: f32,
}

/// A token's log-probability and the most likely alternatives at its position.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprobs {
    pub token_id: u32,
    pub logprob: f32,
    pub top_logprobs: Vec<TopLogprob>,
    /// 1 + how many tokens were more likely; given for prompt tokens (vLLM's
    /// `prompt_logprobs` report it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
}

/// One returned sequence of a request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionOutput {
    pub index: usize,
    pub text: String,
    /// Generated ids, a stop token included (its text is not).
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub stop_reason: Option<StopReason>,
    /// Tracked when logprobs are requested and for best_of / beam search ranking.
    pub cumulative_logprob: Option<f64>,
    pub logprobs: Option<Vec<TokenLogprobs>>,
}

/// One sequence's progress in a step (streamable requests: not best_of > n, not beam search).
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceDelta {
    pub index: usize,
    pub new_token_ids: Vec<u32>,
    /// Newly completed text: never a partial character, never part of a stop string.
    pub text_delta: String,
    pub logprobs: Vec<TokenLogprobs>,
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
}

/// What one step did for one request.
#[derive(Debug, Clone)]
pub struct RequestOutput {
    pub request_id: String,
    pub deltas: Vec<SequenceDelta>,
    /// On the request's last output: the returned sequences (best first for best_of > n and
    /// beam search, else by index).
    pub outputs: Option<Vec<CompletionOutput>>,
    /// On the last output, when prompt logprobs were asked for (`None` for the first token).
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    pub metrics: RequestMetrics,
}

impl RequestOutput {
    pub fn finished(&self) -> bool {
        self.outputs.is_some()
    }
}

/// A finished request, from the offline API.
#[derive(Debug, Clone, Serialize)]
pub struct CompletedRequest {
    pub request_id: String,
    pub prompt_token_ids: Vec<u32>,
    pub outputs: Vec<CompletionOutput>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    #[serde(skip)]
    pub metrics: RequestMetrics,
}

impl CompletedRequest {
    /// The first (best) output.
    pub fn first(&self) -> &CompletionOutput {
        &self.outputs[0]
    }
}

/// One sequence of a request: a parallel sample or a beam (live or finished).
#[derive(Clone)]
pub(crate) struct Member {
    pub index: usize,
    /// Its sequence in the scheduler while live; `None` before its fork and after it ends.
    pub seq: Option<SeqId>,
    pub rng: StdRng,
    pub output: Vec<u32>,
    pub detokenizer: Option<IncrementalDetokenizer>,
    pub text: OutputText,
    pub cumulative_logprob: f64,
    pub logprobs: Vec<TokenLogprobs>,
    pub finish: Option<(FinishReason, Option<StopReason>)>,
    /// Structured outputs: where the output is in its grammar.
    pub grammar: Option<Matcher>,
}

/// The engine's per-request state beside the scheduler's.
pub(crate) struct Request {
    pub id: String,
    pub params: SamplingParams,
    pub prompt: Vec<u32>,
    /// Prompt plus output can grow to this many tokens.
    pub max_len: usize,
    /// Live members (all `best_of` samples are created up front and forked at the first token).
    pub members: Vec<Member>,
    /// Finished members; beam search: finished hypotheses.
    pub done: Vec<Member>,
    /// Token ids that end a sequence: EOS (unless ignored) and the stop token ids.
    pub stop_ids: Vec<u32>,
    /// `bad_words` as token ids (see `admission::bad_word_bans`).
    pub bad_words: Vec<Vec<u32>>,
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    pub metrics: RequestMetrics,
}

impl Request {
    /// Whether the request has sampled nothing yet (its samples are still one sequence).
    pub fn before_first_token(&self) -> bool {
        self.metrics.first_token.is_none()
    }
}
