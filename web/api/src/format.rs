//! The JSON of replies and stream chunks, built from the engine's outputs. Usage is counted
//! while streaming into a `UsageCounter` (prompt tokens once a request finishes, completion
//! tokens per delta).

use infer_core::{CompletionOutput, FinishReason, RequestOutput, TokenLogprobs, Tokenizer};
use serde_json::{json, Value};

use crate::error::RequestError;
use crate::types::Usage;

pub const COMPLETION: &str = "text_completion";
pub const CHAT: &str = "chat.completion";
pub const CHAT_CHUNK: &str = "chat.completion.chunk";

pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// Who answers: the id, creation time and model of every object of one request.
#[derive(Debug, Clone)]
pub struct Reply {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Reply {
    /// One streamed chunk (`object`: `text_completion` or `chat.completion.chunk`).
    pub fn chunk(&self, object: &str, choices: Value, usage: Option<Usage>) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        })
    }

    /// The whole reply of a request that does not stream: a chunk's fields, usage always set.
    pub fn response(&self, object: &str, choices: Vec<Value>, usage: Usage) -> Value {
        self.chunk(object, Value::Array(choices), Some(usage))
    }
}

/// (prompt, completion) tokens seen so far in a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageCounter {
    pub prompt: usize,
    pub completion: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached: usize,
}

impl UsageCounter {
    pub fn usage(&self) -> Usage {
        Usage::new(self.prompt, self.completion).with_cached(self.cached)
    }

    /// A finished request's prompt (and its cached part).
    pub fn add_prompt(&mut self, out: &RequestOutput) {
        self.prompt += out.metrics.num_prompt_tokens;
        self.cached += out.metrics.num_cached_tokens.unwrap_or(0);
    }
}

/// vLLM's `stream_options.continuous_usage_stats`: usage on every chunk, counted per prompt
/// (its tokens, and the completion tokens of its choices so far).
#[derive(Debug, Clone, Default)]
pub struct RunningUsage {
    prompt: Vec<usize>,
    completion: Vec<usize>,
}

impl RunningUsage {
    pub fn new(prompt_lens: Vec<usize>) -> Self {
        let completion = vec![0; prompt_lens.len()];
        RunningUsage {
            prompt: prompt_lens,
            completion,
        }
    }

    /// Counts the tokens one engine output of prompt `i` adds.
    pub fn add(&mut self, i: usize, out: &RequestOutput) {
        let Some(c) = self.completion.get_mut(i) else {
            return;
        };
        if out.deltas.is_empty() {
            // Outputs known only at the end (best_of > n).
            *c += out
                .outputs
                .iter()
                .flatten()
                .map(|o| o.token_ids.len())
                .sum::<usize>();
        } else {
            *c += out
                .deltas
                .iter()
                .map(|d| d.new_token_ids.len())
                .sum::<usize>();
        }
    }

    pub fn usage(&self, i: usize) -> Usage {
        Usage::new(
            self.prompt.get(i).copied().unwrap_or(0),
            self.completion.get(i).copied().unwrap_or(0),
        )
    }
}

fn piece(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// How logprob entries name their tokens: by their text, or as `token_id:N` (vLLM's
/// `return_tokens_as_token_ids`, for tokens whose text does not round-trip, as
/// lm-evaluation-harness asks).
#[derive(Clone, Copy)]
pub struct TokenNames<'a> {
    pub tok: &'a Tokenizer,
    pub as_ids: bool,
}

impl<'a> TokenNames<'a> {
    /// Tokens named by their text.
    pub fn text(tok: &'a Tokenizer) -> Self {
        TokenNames { tok, as_ids: false }
    }

    pub fn new(tok: &'a Tokenizer, as_ids: bool) -> Self {
        TokenNames { tok, as_ids }
    }

    fn name(&self, id: u32) -> String {
        if self.as_ids {
            format!("token_id:{id}")
        } else {
            piece(self.tok, id)
        }
    }
}

/// OpenAI's legacy completion logprobs: tokens, their logprobs, top alternatives and text
/// offsets. With `echo`, the prompt's tokens come first (the first has no logprob), as
/// lm-evaluation-harness's loglikelihood requests read them.
pub fn completion_logprobs(
    names: TokenNames<'_>,
    prompt: &[Option<TokenLogprobs>],
    prompt_ids: &[u32],
    generated: &[TokenLogprobs],
) -> Value {
    let mut offset = 0;
    let (mut tokens, mut logprobs, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    let mut push = |id: u32, lp: Option<&TokenLogprobs>| {
        // Offsets count the names given (vLLM's, with token ids too).
        let text = names.name(id);
        offsets.push(offset);
        offset += text.len();
        tokens.push(text);
        logprobs.push(lp.map_or(Value::Null, |l| json!(l.logprob)));
        let top = lp.map_or(Value::Null, |l| {
            let top: serde_json::Map<String, Value> = l
                .top_logprobs
                .iter()
                .map(|t| (names.name(t.token_id), json!(t.logprob)))
                .collect();
            Value::Object(top)
        });
        tops.push(top);
    };
    for (i, &id) in prompt_ids.iter().enumerate() {
        push(id, prompt.get(i).and_then(Option::as_ref));
    }
    for lp in generated {
        push(lp.token_id, Some(lp));
    }
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
}

/// OpenAI's chat logprobs: `{"content": [{token, logprob, bytes, top_logprobs}]}`; `bytes`
/// are the token text's whatever `names` calls it (as vLLM's).
pub fn chat_logprobs(names: TokenNames<'_>, lps: &[TokenLogprobs]) -> Value {
    let entry = |id: u32, logprob: f32| {
        let text = piece(names.tok, id);
        json!({"token": names.name(id), "logprob": logprob, "bytes": text.as_bytes()})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = entry(lp.token_id, lp.logprob);
            let top: Vec<Value> = lp
                .top_logprobs
                .iter()
                .map(|t| entry(t.token_id, t.logprob))
                .collect();
            e["top_logprobs"] = Value::Array(top);
            e
        })
        .collect();
    json!({ "content": content })
}

/// The choices of one completion stream chunk: a choice per sequence delta (or per finished
/// output for requests that only know their outputs at the end, `best_of > n`). Choice
/// indices are `prompt_index * n + sequence index`.
pub fn completion_stream_choices(
    names: TokenNames<'_>,
    out: &RequestOutput,
    prompt_index: usize,
    n: usize,
    usage: &mut UsageCounter,
) -> Vec<Value> {
    let base = prompt_index * n;
    if out.deltas.is_empty() {
        usage.add_prompt(out);
        return out
            .outputs
            .iter()
            .flatten()
            .map(|o| {
                usage.completion += o.token_ids.len();
                json!({"index": base + o.index, "text": o.text, "logprobs": null,
                    "finish_reason": finish_reason(o.finish_reason), "stop_reason": o.stop_reason})
            })
            .collect();
    }
    if out.finished() {
        usage.add_prompt(out);
    }
    out.deltas
        .iter()
        .map(|d| {
            usage.completion += d.new_token_ids.len();
            json!({
                "index": base + d.index,
                "text": d.text_delta,
                "logprobs": (!d.logprobs.is_empty()).then(|| completion_logprobs(names, &[], &[], &d.logprobs)),
                "finish_reason": d.finish_reason.map(finish_reason),
                "stop_reason": d.stop_reason,
            })
        })
        .collect()
}

/// A completion stream's first choices with `echo`: each choice's prompt text, sent before
/// the generated text as vLLM does. Each choice goes in a chunk of its own.
pub fn completion_echo_choices(
    tok: &Tokenizer,
    prompts: &[Vec<u32>],
    n: usize,
) -> infer_core::Result<Vec<Value>> {
    let mut choices = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let text = tok.decode(p, false)?;
        choices.extend((0..n).map(
            |j| json!({"index": i * n + j, "text": text, "logprobs": null, "finish_reason": null}),
        ));
    }
    Ok(choices)
}

/// The first chat chunk's choices: each choice's role, and its content so far (`echo`).
pub fn chat_role_choices(n: usize, echo: &str) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"index": i, "delta": {"role": "assistant", "content": echo}, "logprobs": null, "finish_reason": null}))
        .collect()
}

/// Chat stream choices for one engine output: a content delta per sequence that produced
/// text (or logprobs), then a separate empty delta with the finish reason, as OpenAI sends
/// them. Each choice goes in a chunk of its own.
pub fn chat_stream_choices(
    names: TokenNames<'_>,
    out: &RequestOutput,
    usage: &mut UsageCounter,
) -> Vec<Value> {
    if out.finished() {
        usage.add_prompt(out);
    }
    let mut choices = Vec::new();
    for d in &out.deltas {
        usage.completion += d.new_token_ids.len();
        if !d.text_delta.is_empty() || !d.logprobs.is_empty() {
            choices.push(json!({
                "index": d.index,
                "delta": {"content": d.text_delta},
                "logprobs": (!d.logprobs.is_empty()).then(|| chat_logprobs(names, &d.logprobs)),
                "finish_reason": null,
            }));
        }
        if let Some(r) = d.finish_reason {
            choices.push(json!({"index": d.index, "delta": {}, "logprobs": null,
                "finish_reason": finish_reason(r), "stop_reason": d.stop_reason}));
        }
    }
    if out.deltas.is_empty() {
        // Known only at the end (best_of > n): each output as one delta.
        for o in out.outputs.iter().flatten() {
            usage.completion += o.token_ids.len();
            choices.push(
                json!({"index": o.index, "delta": {"content": o.text}, "logprobs": null,
                "finish_reason": finish_reason(o.finish_reason), "stop_reason": o.stop_reason}),
            );
        }
    }
    choices
}

/// A finished chat choice.
pub fn chat_choice(names: TokenNames<'_>, o: &CompletionOutput) -> Value {
    json!({
        "index": o.index,
        "message": {"role": "assistant", "content": o.text},
        "logprobs": o.logprobs.as_ref().map(|l| chat_logprobs(names, l)),
        "finish_reason": finish_reason(o.finish_reason),
        "stop_reason": o.stop_reason,
    })
}

/// An echoed prompt: its text, token ids and their logprobs (the first is `None`).
pub type Echo<'a> = (&'a str, &'a [u32], &'a [Option<TokenLogprobs>]);

/// vLLM's `prompt_logprobs`: `null` for the first token, then for each a map from token id
/// to `{logprob, rank, decoded_token}` holding the prompt's token and the top alternatives.
pub fn prompt_logprobs(tok: &Tokenizer, lps: &[Option<TokenLogprobs>]) -> Value {
    let entry = |id: u32, logprob: f32, rank: Option<usize>| {
        (
            id.to_string(),
            json!({"logprob": logprob, "rank": rank, "decoded_token": piece(tok, id)}),
        )
    };
    let positions: Vec<Value> = lps
        .iter()
        .map(|lp| {
            lp.as_ref().map_or(Value::Null, |lp| {
                let mut map = serde_json::Map::new();
                for (r, t) in lp.top_logprobs.iter().enumerate() {
                    let (k, v) = entry(t.token_id, t.logprob, Some(r + 1));
                    map.insert(k, v);
                }
                let (k, v) = entry(lp.token_id, lp.logprob, lp.rank);
                map.insert(k, v);
                Value::Object(map)
            })
        })
        .collect();
    Value::Array(positions)
}

/// A finished completion choice; `echo` puts the prompt's text (and with logprobs its
/// tokens' logprobs) first, `prompt_only` drops the one token generated to score the prompt.
pub struct CompletionChoice<'a> {
    pub prompt_index: usize,
    pub n: usize,
    pub echo: Option<Echo<'a>>,
    pub prompt_only: bool,
    /// vLLM's `prompt_logprobs` of the choice's prompt, when asked for.
    pub prompt_logprobs: Option<&'a [Option<TokenLogprobs>]>,
}

impl CompletionChoice<'_> {
    /// The choice and its number of completion tokens.
    pub fn build(&self, names: TokenNames<'_>, mut o: CompletionOutput) -> (Value, usize) {
        if self.prompt_only {
            o.text.clear();
            o.token_ids.clear();
            o.logprobs = o.logprobs.map(|_| Vec::new());
        }
        let (prompt_text, prompt_ids, prompt_lps) = self.echo.unwrap_or(("", &[], &[]));
        let logprobs = o
            .logprobs
            .as_ref()
            .map(|lps| completion_logprobs(names, prompt_lps, prompt_ids, lps));
        let choice = json!({
            "index": self.prompt_index * self.n + o.index,
            "text": format!("{prompt_text}{}", o.text),
            "logprobs": logprobs,
            "finish_reason": if self.prompt_only { "length" } else { finish_reason(o.finish_reason) },
            // vLLM's: the stop string, or the stop token's id (null for EOS and length).
            "stop_reason": o.stop_reason,
            "prompt_logprobs": self.prompt_logprobs.map(|lps| prompt_logprobs(names.tok, lps)),
        });
        (choice, o.token_ids.len())
    }
}

/// One prompt's engine request, finished: what a non-streamed reply is built from.
#[derive(Debug, Clone)]
pub struct FinishedPrompt {
    pub outputs: Vec<CompletionOutput>,
    pub prompt_len: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached: usize,
    /// Per prompt position, when `prompt_logprobs` or `echo` with logprobs asked for them.
    pub prompt_logprobs: Vec<Option<TokenLogprobs>>,
}

/// How a non-streamed completion's choices are written: the one builder `infer serve` and
/// the browser engine share, so both reply alike (and fail alike).
#[derive(Debug, Clone, Copy)]
pub struct CompletionReply {
    pub n: usize,
    pub echo: bool,
    /// vLLM's `max_tokens: 0` with `echo`: the one token generated to score the prompt is
    /// dropped.
    pub prompt_only: bool,
    pub prompt_logprobs: bool,
    /// `return_tokens_as_token_ids`.
    pub token_ids: bool,
}

impl CompletionReply {
    /// Every prompt's choices (prompt `i`'s outputs at indices `i * n ..`) and the usage. A
    /// prompt whose text does not decode for `echo` is an error, not an empty text.
    pub fn choices(
        &self,
        tok: &Tokenizer,
        prompts: &[Vec<u32>],
        finished: Vec<FinishedPrompt>,
    ) -> Result<(Vec<Value>, Usage), RequestError> {
        let (mut choices, mut prompt_tokens, mut completion_tokens, mut cached) =
            (Vec::new(), 0, 0, 0);
        for (i, (done, prompt)) in finished.into_iter().zip(prompts).enumerate() {
            prompt_tokens += done.prompt_len;
            cached += done.cached;
            let text = if self.echo {
                tok.decode(prompt, false)?
            } else {
                String::new()
            };
            let choice = CompletionChoice {
                prompt_index: i,
                n: self.n,
                echo: self
                    .echo
                    .then_some((&text[..], &prompt[..], &done.prompt_logprobs[..])),
                prompt_only: self.prompt_only,
                prompt_logprobs: self.prompt_logprobs.then_some(&done.prompt_logprobs[..]),
            };
            for o in done.outputs {
                let (c, tokens) = choice.build(TokenNames::new(tok, self.token_ids), o);
                completion_tokens += tokens;
                choices.push(c);
            }
        }
        Ok((
            choices,
            Usage::new(prompt_tokens, completion_tokens).with_cached(cached),
        ))
    }
}
