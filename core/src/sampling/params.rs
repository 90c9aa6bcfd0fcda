//! Per-request sampling parameters, named and defaulted as vLLM's `SamplingParams` and the
//! OpenAI API, validated with messages that name the parameter.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::structured::StructuredOutput;
use crate::error::{InferError, Result};

/// Most top logprobs a request may ask for per token by default (OpenAI allows 20; an
/// engine's `set_max_logprobs` changes it).
pub const MAX_LOGPROBS: usize = 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Sequences returned.
    pub n: usize,
    /// Sequences generated, the `n` with the highest cumulative logprob returned (default `n`).
    /// With beam search it is the beam width.
    pub best_of: Option<usize>,
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus sampling: the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Only the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Drops tokens less likely than `min_p` times the most likely one.
    pub min_p: f32,
    /// Above 1 discourages tokens already in the prompt or output (CTRL-style: logits divided
    /// if positive, multiplied if negative).
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token the output already contains.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time the output contains it.
    pub frequency_penalty: f32,
    /// Added to the logits of these token ids.
    pub logit_bias: BTreeMap<u32, f32>,
    /// Only these token ids may be generated (vLLM's `allowed_token_ids`).
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Words the output may not contain (vLLM's `bad_words`): the last token of each word's
    /// tokenization, with and without a leading space, is banned wherever the output ends
    /// with the tokens before it.
    pub bad_words: Vec<String>,
    /// Makes the request's draws reproducible whatever else is in the batch.
    pub seed: Option<u64>,
    /// Output tokens at most (`None`: up to the context limit).
    pub max_tokens: Option<usize>,
    /// Output tokens before EOS, stop token ids or stop strings may end the sequence.
    pub min_tokens: usize,
    /// Strings that end generation; the text stops before them.
    pub stop: Vec<String>,
    /// Token ids that end generation (besides the model's EOS).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating after EOS.
    pub ignore_eos: bool,
    /// Keep the stop string (or the stop token's text) that ended the output in its text.
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: bool,
    /// Top logprobs reported per generated token (plus the chosen token's own).
    pub logprobs: Option<usize>,
    /// Top logprobs reported per prompt token (disables prefix-cache hits for the request).
    pub prompt_logprobs: Option<usize>,
    pub use_beam_search: bool,
    /// Beam scores are `cumulative_logprob / generated_len ^ length_penalty`.
    pub length_penalty: f32,
    /// Beam search ends as soon as `best_of` hypotheses are finished, instead of when no
    /// running beam can beat them any more.
    pub early_stopping: bool,
    /// Constrains the output to a JSON schema, regex, choice or grammar (llguidance).
    pub structured_outputs: Option<StructuredOutput>,
    /// Scheduling priority, lower first (vLLM's `priority`); an engine takes values other
    /// than 0 only when it schedules by priority (`Engine::set_priority_scheduling`).
    pub priority: i64,
    /// vLLM's `cache_salt`: the request's prompt blocks are cached, and found, only among
    /// requests with the same salt (one tenant cannot probe another's prompts by timing).
    pub cache_salt: Option<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            n: 1,
            best_of: None,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: BTreeMap::new(),
            allowed_token_ids: None,
            bad_words: Vec::new(),
            seed: None,
            max_tokens: None,
            min_tokens: 0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            include_stop_str_in_output: false,
            skip_special_tokens: true,
            logprobs: None,
            prompt_logprobs: None,
            use_beam_search: false,
            length_penalty: 1.0,
            early_stopping: false,
            structured_outputs: None,
            priority: 0,
            cache_salt: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams {
            temperature: 0.0,
            max_tokens: Some(max_tokens),
            ..Default::default()
        }
    }

    /// Sequences generated for the request (beam width with beam search).
    pub fn best_of(&self) -> usize {
        self.best_of.unwrap_or(self.n)
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether a row of this request is just the argmax of the raw logits (greedy, one
    /// sequence, no logprobs, penalties or bias), which a backend may compute on the device.
    pub fn is_plain_greedy(&self) -> bool {
        self.is_greedy()
            && !self.use_beam_search
            && self.best_of() == 1
            && !self.needs_logprobs()
            && self.prompt_logprobs.is_none()
            && !self.has_penalties()
            && self.logit_bias.is_empty()
            && self.allowed_token_ids.is_none()
            && self.bad_words.is_empty()
            && self.structured_outputs.is_none()
    }

    /// Whether the logits need any penalty pass.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Whether the cumulative logprob must be tracked: reported, or needed to rank.
    pub fn needs_logprobs(&self) -> bool {
        self.logprobs.is_some() || self.best_of() > self.n || self.use_beam_search
    }

    /// Whether per-step deltas can be streamed: not when the returned sequences are only
    /// known at the end (best_of > n, beam search).
    pub fn streamable(&self) -> bool {
        !self.use_beam_search && self.best_of() == self.n
    }

    /// Checks ranges and combinations; the error names the parameter.
    pub fn validate(&self) -> Result<()> {
        if self.use_beam_search && self.structured_outputs.is_some() {
            return Err(InferError::invalid(
                super::structured::PARAM,
                "structured outputs are not supported with beam search",
            ));
        }
        if self.n == 0 {
            return Err(InferError::invalid("n", "must be at least 1"));
        }
        if self.cache_salt.as_deref() == Some("") {
            return Err(InferError::invalid(
                "cache_salt",
                "must be a non-empty string when given",
            ));
        }
        if self.best_of() < self.n {
            return Err(InferError::invalid(
                "best_of",
                format!("{} must be >= n ({})", self.best_of(), self.n),
            ));
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(InferError::invalid(
                "temperature",
                format!("{} must be a finite number >= 0", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(InferError::invalid(
                "top_p",
                format!("{} must be in (0, 1]", self.top_p),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(InferError::invalid(
                "min_p",
                format!("{} must be in [0, 1]", self.min_p),
            ));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(InferError::invalid(
                "repetition_penalty",
                format!("{} must be > 0", self.repetition_penalty),
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(InferError::invalid(name, format!("{v} must be in [-2, 2]")));
            }
        }
        // OpenAI's range: -100 bans a token, 100 forces it.
        if let Some((id, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(*b))
        {
            return Err(InferError::invalid(
                "logit_bias",
                format!("token {id}: {b} must be in [-100, 100]"),
            ));
        }
        if self.max_tokens == Some(0) {
            return Err(InferError::invalid("max_tokens", "must be at least 1"));
        }
        if self.max_tokens.is_some_and(|m| self.min_tokens > m) {
            return Err(InferError::invalid(
                "min_tokens",
                format!("{} exceeds max_tokens", self.min_tokens),
            ));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(InferError::invalid(
                "stop",
                "stop strings must not be empty",
            ));
        }
        if self.allowed_token_ids.as_ref().is_some_and(Vec::is_empty) {
            return Err(InferError::invalid(
                "allowed_token_ids",
                "must hold at least one token id",
            ));
        }
        if self.bad_words.iter().any(|w| w.trim().is_empty()) {
            return Err(InferError::invalid("bad_words", "words must not be empty"));
        }
        if self.use_beam_search {
            if !self.is_greedy() || self.top_p < 1.0 || self.top_k != 0 || self.min_p > 0.0 {
                return Err(InferError::invalid(
                    "use_beam_search",
                    "beam search is deterministic: set temperature 0 and leave top_p, top_k, min_p off",
                ));
            }
            if !self.length_penalty.is_finite() {
                return Err(InferError::invalid("length_penalty", "must be finite"));
            }
        } else if self.is_greedy() && self.best_of() > 1 {
            // Name the field the client set: `best_of` only when it asked for more than `n`.
            let name = if self.best_of.is_some_and(|b| b > self.n) {
                "best_of"
            } else {
                "n"
            };
            return Err(InferError::invalid(
                name,
                "greedy sampling gives the same sequence every time: use temperature > 0 or beam search for n / best_of > 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(p: SamplingParams) -> String {
        p.validate().unwrap_err().to_string()
    }

    #[test]
    fn defaults_are_valid_and_bad_values_name_the_parameter() {
        SamplingParams::default().validate().unwrap();
        SamplingParams::greedy(4).validate().unwrap();
        let d = SamplingParams::default;
        assert!(err(SamplingParams { n: 0, ..d() }).contains("`n`"));
        assert!(err(SamplingParams {
            n: 3,
            best_of: Some(2),
            ..d()
        })
        .contains("best_of"));
        assert!(err(SamplingParams {
            temperature: -1.0,
            ..d()
        })
        .contains("temperature"));
        assert!(err(SamplingParams { top_p: 0.0, ..d() }).contains("top_p"));
        assert!(err(SamplingParams { min_p: 1.5, ..d() }).contains("min_p"));
        assert!(err(SamplingParams {
            repetition_penalty: 0.0,
            ..d()
        })
        .contains("repetition_penalty"));
        assert!(err(SamplingParams {
            frequency_penalty: 3.0,
            ..d()
        })
        .contains("frequency_penalty"));
        assert!(err(SamplingParams {
            max_tokens: Some(2),
            min_tokens: 3,
            ..d()
        })
        .contains("min_tokens"));
        assert!(err(SamplingParams {
            stop: vec![String::new()],
            ..d()
        })
        .contains("stop"));
        assert!(err(SamplingParams {
            allowed_token_ids: Some(vec![]),
            ..d()
        })
        .contains("allowed_token_ids"));
        assert!(err(SamplingParams {
            bad_words: vec![" ".into()],
            ..d()
        })
        .contains("bad_words"));
        assert!(err(SamplingParams {
            n: 2,
            ..SamplingParams::greedy(4)
        })
        .contains("greedy"));
        assert!(err(SamplingParams {
            use_beam_search: true,
            best_of: Some(4),
            ..d()
        })
        .contains("temperature 0"));
    }

    #[test]
    fn deserializes_from_json_with_defaults_and_rejects_unknown_fields() {
        let p: SamplingParams =
            serde_json::from_str(r#"{"temperature":0.5,"logit_bias":{"7":-100},"stop":["\n"]}"#)
                .unwrap();
        assert_eq!(p.temperature, 0.5);
        assert_eq!(p.logit_bias[&7], -100.0);
        assert_eq!(p.n, 1);
        assert!(serde_json::from_str::<SamplingParams>(r#"{"temprature":1}"#).is_err());
    }
}
