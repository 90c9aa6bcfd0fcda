//! Sampling flags shared by `infer generate` (and later the server's defaults), mapped onto
//! the core's `SamplingParams`, plus the JSON shape of a finished request.

use anyhow::{bail, Context, Result};
use clap::Args;
use infer_core::{CompletionOutput, SamplingParams, TokenLogprobs};
use serde_json::{json, Value};

#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Output tokens at most (negative numbers parse, and are refused by name).
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    pub max_tokens: i64,
    /// Output tokens before EOS / stop conditions may end a sequence.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub min_tokens: i64,
    /// 0 samples greedily.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// `TOKEN_ID=BIAS`, repeatable.
    #[arg(long, value_name = "ID=BIAS", allow_hyphen_values = true)]
    pub logit_bias: Vec<String>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Constrains the output (llguidance), as vLLM's `structured_outputs`: `{"json": SCHEMA}`,
    /// `{"regex": "..."}`, `{"choice": ["a", "b"]}`, `{"grammar": "start: ..."}` (Lark) or
    /// `"json_object"`.
    #[arg(long, value_name = "JSON")]
    pub structured_outputs: Option<String>,
    /// A string that ends generation (not included in the text); repeatable.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep the stop string that ended the output in the text.
    #[arg(long)]
    pub include_stop_str_in_output: bool,
    /// A word the output may not contain; repeatable (vLLM's `bad_words`).
    #[arg(long, value_name = "WORD")]
    pub bad_words: Vec<String>,
    /// Only these token ids may be generated, comma-separated (vLLM's `allowed_token_ids`).
    #[arg(long, value_delimiter = ',')]
    pub allowed_token_ids: Vec<u32>,
    /// Token ids that end generation, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub stop_token_ids: Vec<u32>,
    #[arg(long)]
    pub ignore_eos: bool,
    /// Keep special tokens in the text.
    #[arg(long)]
    pub keep_special_tokens: bool,
    /// Report this many top logprobs per generated token (with `--json`).
    #[arg(long)]
    pub logprobs: Option<usize>,
    /// Report this many top logprobs per prompt token (with `--json`).
    #[arg(long)]
    pub prompt_logprobs: Option<usize>,
    /// Sequences returned per prompt.
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// Sequences sampled per prompt; the `n` most likely are returned.
    #[arg(long)]
    pub best_of: Option<usize>,
    /// Beam search with this many beams (greedy, deterministic).
    #[arg(long, conflicts_with = "best_of")]
    pub beam_width: Option<usize>,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub length_penalty: f32,
    /// Beam search stops once `beam width` hypotheses finished.
    #[arg(long)]
    pub early_stopping: bool,
}

/// A count flag's value, at least `min` (the error names the parameter, as the API's do).
fn count(name: &'static str, value: i64, min: i64) -> Result<usize> {
    if value < min {
        return Err(infer_core::InferError::invalid(
            name,
            format!("{value} must be at least {min}"),
        )
        .into());
    }
    usize::try_from(value)
        .with_context(|| format!("--{}: {value} is too large", name.replace('_', "-")))
}

impl SamplingArgs {
    /// The parameters for one prompt (`max_tokens` overridden per prompt by a prompts file).
    pub fn params(&self, max_tokens: Option<usize>) -> Result<SamplingParams> {
        let mut logit_bias = std::collections::BTreeMap::new();
        for entry in &self.logit_bias {
            let (id, bias) = entry
                .split_once('=')
                .with_context(|| format!("--logit-bias `{entry}`: expected TOKEN_ID=BIAS"))?;
            let id: u32 = id
                .trim()
                .parse()
                .with_context(|| format!("--logit-bias `{entry}`: bad token id"))?;
            let bias: f32 = bias
                .trim()
                .parse()
                .with_context(|| format!("--logit-bias `{entry}`: bad bias"))?;
            logit_bias.insert(id, bias);
        }
        let beam = self.beam_width.is_some();
        if beam && self.temperature != 1.0 && self.temperature != 0.0 {
            bail!("--beam-width is deterministic: leave --temperature out");
        }
        let p = SamplingParams {
            n: self.n,
            best_of: self.beam_width.or(self.best_of),
            temperature: if beam { 0.0 } else { self.temperature },
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias,
            seed: self.seed,
            max_tokens: Some(match max_tokens {
                Some(m) => m,
                None => count("max_tokens", self.max_tokens, 1)?,
            }),
            min_tokens: count("min_tokens", self.min_tokens, 0)?,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            include_stop_str_in_output: self.include_stop_str_in_output,
            bad_words: self.bad_words.clone(),
            allowed_token_ids: (!self.allowed_token_ids.is_empty())
                .then(|| self.allowed_token_ids.clone()),
            priority: 0,
            cache_salt: None,
            skip_special_tokens: !self.keep_special_tokens,
            logprobs: self.logprobs,
            prompt_logprobs: self.prompt_logprobs,
            use_beam_search: beam,
            length_penalty: self.length_penalty,
            early_stopping: self.early_stopping,
            structured_outputs: match &self.structured_outputs {
                Some(s) => Some(serde_json::from_str(s).with_context(|| {
                    format!("--structured-outputs `{s}`: expected {{\"json\": ...}}, {{\"regex\": ...}}, {{\"choice\": [...]}}, {{\"grammar\": ...}} or \"json_object\"")
                })?),
                None => None,
            },
        };
        p.validate()?;
        Ok(p)
    }
}

/// A finished request as JSON: `outputs` (one per returned sequence) and, for the first
/// output, the flat `text` / `token_ids` / `finish_reason` fields single-output callers read.
pub fn completion_json(
    prompt_token_ids: &[u32],
    outputs: &[CompletionOutput],
    prompt_logprobs: Option<&Vec<Option<TokenLogprobs>>>,
) -> Value {
    let mut obj = json!({
        "prompt_token_ids": prompt_token_ids,
        "outputs": outputs,
    });
    if let Some(first) = outputs.first() {
        obj["text"] = json!(first.text);
        obj["token_ids"] = json!(first.token_ids);
        obj["finish_reason"] = json!(first.finish_reason);
        obj["stop_reason"] = json!(first.stop_reason);
    }
    if let Some(p) = prompt_logprobs {
        obj["prompt_logprobs"] = json!(p);
    }
    obj
}
