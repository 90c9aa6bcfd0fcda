//! OpenAI's request and response bodies (the fields vLLM's server accepts, vLLM's extras
//! included). A field we do not know is refused by name (`prepare::check_extra_fields`), except
//! the few listed in `IGNORED_FIELDS`, which change nothing about the output.

use std::collections::HashMap;

use infer_core::{InferError, SamplingParams};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::structured::StructuredFields;
pub use crate::tools::{Tool, ToolCallIn, ToolChoice};

/// `prompt` of `/v1/completions`: a string, strings, token ids or lists of token ids.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

impl StopInput {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopInput::One(s) => vec![s],
            StopInput::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    /// vLLM: usage on every chunk, not only on the last.
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

/// Request fields accepted and ignored: bookkeeping for OpenAI's platform that changes nothing
/// in the output (`user`, `store`, `metadata`, `service_tier`), and vLLM's choice of
/// structured-output backend (there is one here, llguidance).
pub const IGNORED_FIELDS: &[&str] = &[
    "user",
    "store",
    "metadata",
    "service_tier",
    "guided_decoding_backend",
    // Predicted outputs only speed up generation; the output is the same without them.
    "prediction",
    // vLLM applies it only in the slow tokenizers' decode path; fast tokenizers (the only
    // kind here) decode the same either way.
    "spaces_between_special_tokens",
];

/// The sampling fields shared by completions and chat completions.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct SamplingFields {
    pub n: Option<usize>,
    pub best_of: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// vLLM: -1 (or 0) = all tokens.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string, as JSON keys are) → bias.
    pub logit_bias: Option<HashMap<String, f32>>,
    pub seed: Option<u64>,
    pub stop: Option<StopInput>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<usize>,
    pub skip_special_tokens: Option<bool>,
    /// vLLM: only these token ids may be generated.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// vLLM: words the output may not contain.
    pub bad_words: Option<Vec<String>>,
    /// vLLM: keep the stop string that ended the output in its text.
    pub include_stop_str_in_output: Option<bool>,
    /// vLLM: keep only the prompt's last N tokens (-1: as many as the context holds).
    pub truncate_prompt_tokens: Option<i64>,
    /// vLLM: scheduling priority, lower first (needs `--scheduling-policy priority` unless 0).
    pub priority: Option<i64>,
    /// vLLM: the prompt's blocks are cached and found only among requests with the same salt.
    pub cache_salt: Option<String>,
    /// vLLM: the id the request runs under; the reply's `id` is the endpoint's prefix + it.
    pub request_id: Option<String>,
    /// vLLM: logprob tokens as `token_id:ID` instead of their text.
    pub return_tokens_as_token_ids: Option<bool>,
    /// vLLM: beam search with `n` beams (deterministic; `temperature` 0 or left out).
    pub use_beam_search: Option<bool>,
    /// vLLM's beam search: scores are `logprob / length ^ length_penalty`.
    pub length_penalty: Option<f32>,
    /// vLLM's beam search: stop once `n` hypotheses finished.
    pub early_stopping: Option<bool>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
}

impl SamplingFields {
    /// The engine's parameters (`max_tokens` `None`: up to the context); fields the request
    /// leaves out come from `defaults` (the model's generation config), then OpenAI's.
    pub fn to_params(
        &self,
        max_tokens: Option<usize>,
        logprobs: Option<usize>,
        defaults: &crate::defaults::RequestDefaults,
    ) -> Result<SamplingParams, InferError> {
        let d = SamplingParams::default();
        let mut logit_bias = std::collections::BTreeMap::new();
        for (k, v) in self.logit_bias.iter().flatten() {
            let id = k.parse::<u32>().map_err(|_| {
                InferError::invalid("logit_bias", format!("`{k}` is not a token id"))
            })?;
            logit_bias.insert(id, *v);
        }
        let top_k = match self.top_k.or(defaults.top_k) {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
            Some(k) => {
                return Err(InferError::invalid(
                    "top_k",
                    format!("{k} must be -1 or > 0"),
                ))
            }
        };
        let beam = self.use_beam_search.unwrap_or(false);
        let n = self.n.unwrap_or(1);
        if let Some(r) = &self.request_id {
            if r.is_empty() || r.len() > 256 || r.chars().any(char::is_control) {
                return Err(InferError::invalid(
                    "request_id",
                    "must be 1 to 256 printable characters",
                ));
            }
        }
        Ok(SamplingParams {
            n,
            // vLLM's beam search keeps `n` beams and returns them.
            best_of: if beam {
                self.best_of.or(Some(n))
            } else {
                self.best_of
            },
            use_beam_search: beam,
            length_penalty: self.length_penalty.unwrap_or(d.length_penalty),
            early_stopping: self.early_stopping.unwrap_or(false),
            // Beam search is deterministic: its temperature is 0 unless the request says
            // otherwise (which validation then refuses, naming it).
            temperature: self
                .temperature
                .or(if beam { None } else { defaults.temperature })
                .unwrap_or(if beam { 0.0 } else { 1.0 }),
            top_p: self.top_p.or(defaults.top_p).unwrap_or(d.top_p),
            top_k,
            min_p: self.min_p.or(defaults.min_p).unwrap_or(d.min_p),
            repetition_penalty: self
                .repetition_penalty
                .or(defaults.repetition_penalty)
                .unwrap_or(d.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            logit_bias,
            seed: self.seed,
            max_tokens,
            min_tokens: self.min_tokens.unwrap_or(0),
            stop: self
                .stop
                .clone()
                .map(StopInput::into_vec)
                .unwrap_or_default(),
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            allowed_token_ids: self.allowed_token_ids.clone(),
            bad_words: self.bad_words.clone().unwrap_or_default(),
            include_stop_str_in_output: self.include_stop_str_in_output.unwrap_or(false),
            priority: self.priority.unwrap_or(0),
            cache_salt: self.cache_salt.clone(),
            logprobs,
            ..d
        })
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// vLLM: usage on every chunk (with `include_usage`).
    pub fn continuous_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage && o.continuous_usage_stats)
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    /// OpenAI's default for completions is 16.
    pub max_tokens: Option<usize>,
    pub logprobs: Option<usize>,
    #[serde(default)]
    pub echo: bool,
    /// vLLM: each prompt token's logprob, rank and the top alternatives, in the choice's
    /// `prompt_logprobs`.
    pub prompt_logprobs: Option<usize>,
    /// vLLM: add the tokenizer's special tokens (BOS) to a text prompt (default true).
    pub add_special_tokens: Option<bool>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(flatten)]
    pub structured: StructuredFields,
    /// Every field not named above (checked against `IGNORED_FIELDS`).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A message's `content`: a string, or OpenAI's list of parts.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a message's content (`{"type": "text", "text": ...}`; other types are refused).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// A participant's name: accepted, not shown to the model (as vLLM with most templates).
    #[serde(default, skip_serializing)]
    pub name: Option<String>,
    /// An assistant's past calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A tool result's call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessageIn>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    pub add_generation_prompt: Option<bool>,
    /// vLLM: the reply continues the last (assistant) message instead of starting a new one.
    #[serde(default)]
    pub continue_final_message: bool,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// vLLM: extra variables for the chat template (Qwen3's `enable_thinking`, …).
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// vLLM: documents for retrieval-augmented templates (the template's `documents`).
    pub documents: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
    /// OpenAI's reasoning effort, handed to the template as `reasoning_effort` (as vLLM:
    /// gpt-oss templates read it).
    pub reasoning_effort: Option<String>,
    /// vLLM: a template for this request only (refused unless the server runs with
    /// `--trust-request-chat-template`).
    pub chat_template: Option<String>,
    /// vLLM: the reply's content starts with the last message's, when the reply continues
    /// it (same role: `continue_final_message`).
    #[serde(default)]
    pub echo: bool,
    /// vLLM: the prompt's logprobs in the reply's `prompt_logprobs` (not when streaming).
    pub prompt_logprobs: Option<usize>,
    /// vLLM: add the tokenizer's special tokens to the rendered template (default false:
    /// the template holds them).
    pub add_special_tokens: Option<bool>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    #[serde(flatten)]
    pub structured: StructuredFields,
    /// Every field not named above (checked against `IGNORED_FIELDS`).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's `usage.prompt_tokens_details`: prompt tokens whose KV came from the prefix cache.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails::default(),
        }
    }

    pub fn with_cached(mut self, cached_tokens: usize) -> Self {
        self.prompt_tokens_details.cached_tokens = cached_tokens;
        self
    }
}

/// vLLM's `POST /tokenize` body (also `engine.tokenize` in the browser): a `prompt`, or chat
/// `messages` rendered with the model's template. Other fields are refused by name.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// Checked against the served model when given.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Messages only: tools shown to the model, as a chat request's `tools`.
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    /// Messages only: extra chat-template variables, as a chat request's.
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Default: true for a prompt, false for messages (the template holds them), as vLLM.
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// Messages only (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub continue_final_message: bool,
    /// Also return each token's text in the vocabulary.
    #[serde(default)]
    pub return_token_strs: bool,
}

/// vLLM's `POST /detokenize` body.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}
