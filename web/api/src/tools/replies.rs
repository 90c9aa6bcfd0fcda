//! Chat replies with tool calls read out of them: the `message` of a finished choice, and
//! the stream chunks' `delta.content` / `delta.tool_calls`. Without tools in play these are
//! the plain chat replies of `format`.

use std::collections::BTreeMap;

use infer_core::{CompletionOutput, RequestOutput, Tokenizer};
use serde_json::{json, Value};

use super::stream::ToolStream;
use super::ToolPlan;
use crate::format::{
    chat_choice, chat_logprobs, chat_stream_choices, finish_reason, TokenNames, UsageCounter,
};
use crate::reasoning::{ReasoningParser, ReasoningStream};

/// The replies of one chat request: its tool plan, each choice's reading so far, and usage.
#[derive(Debug)]
pub struct ChatReplies {
    plan: Option<ToolPlan>,
    /// Call ids are `call_<request>_<choice>_<call>`.
    id_prefix: String,
    streams: BTreeMap<usize, ToolStream>,
    pub usage: UsageCounter,
    /// vLLM's chat `echo`: the text every choice's content starts with.
    echo: Option<String>,
    /// Reasoning split from the answer (`--reasoning-parser`), and each streamed choice's
    /// progress through it.
    reasoning: Option<ReasoningParser>,
    thinking: BTreeMap<usize, ReasoningStream>,
    /// Logprob tokens as `token_id:N` (`return_tokens_as_token_ids`).
    token_ids: bool,
}

impl ChatReplies {
    pub fn new(plan: Option<ToolPlan>, reply_id: &str) -> Self {
        let request = reply_id.strip_prefix("chatcmpl-").unwrap_or(reply_id);
        ChatReplies {
            plan,
            id_prefix: format!("call_{request}_"),
            streams: BTreeMap::new(),
            usage: UsageCounter::default(),
            echo: None,
            reasoning: None,
            thinking: BTreeMap::new(),
            token_ids: false,
        }
    }

    /// Logprob entries name their tokens `token_id:N` (vLLM's `return_tokens_as_token_ids`).
    pub fn with_token_ids(mut self, token_ids: bool) -> Self {
        self.token_ids = token_ids;
        self
    }

    fn names<'t>(&self, tok: &'t Tokenizer) -> TokenNames<'t> {
        TokenNames::new(tok, self.token_ids)
    }

    /// Replies carry reasoning apart from the answer (`reasoning_content`).
    pub fn with_reasoning(mut self, parser: Option<ReasoningParser>) -> Self {
        self.reasoning = parser;
        self
    }

    /// Every choice's content starts with `echo` (a stream sends it in the role chunk).
    pub fn with_echo(mut self, echo: Option<String>) -> Self {
        self.echo = echo;
        self
    }

    /// The first chunk's choices: each choice's role, with the echoed text as its content.
    pub fn role_choices(&self, n: usize) -> Vec<Value> {
        crate::format::chat_role_choices(n, self.echo.as_deref().unwrap_or(""))
    }

    /// A finished choice, its content after the echoed text, its reasoning apart.
    pub fn choice(&self, tok: &Tokenizer, o: &CompletionOutput) -> Value {
        let split = self.reasoning.map(|p| p.split(&o.text));
        let mut choice = match &split {
            Some((_, content)) => {
                let answer = CompletionOutput {
                    text: content.clone(),
                    ..o.clone()
                };
                self.reply_choice(tok, &answer)
            }
            None => self.reply_choice(tok, o),
        };
        if let Some((reasoning, _)) = split {
            choice["message"]["reasoning_content"] = reasoning.into();
        }
        if let Some(echo) = &self.echo {
            let content = &mut choice["message"]["content"];
            *content = format!("{echo}{}", content.as_str().unwrap_or_default()).into();
        }
        choice
    }

    fn fresh(&self, plan: &ToolPlan, choice: usize) -> ToolStream {
        let prefix = format!("{}{choice}_", self.id_prefix);
        ToolStream::new(plan.format.clone(), plan.parallel, prefix)
    }

    /// A finished choice: `message.content` and `message.tool_calls`.
    fn reply_choice(&self, tok: &Tokenizer, o: &CompletionOutput) -> Value {
        let Some(plan) = &self.plan else {
            return chat_choice(self.names(tok), o);
        };
        let (content, calls, read) = self.fresh(plan, o.index).complete(&o.text);
        let mut message = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            message["tool_calls"] = calls.iter().map(|c| c.to_json()).collect();
        }
        json!({
            "index": o.index,
            "message": message,
            "logprobs": o.logprobs.as_ref().map(|l| chat_logprobs(self.names(tok), l)),
            "finish_reason": read.finish_reason(finish_reason(o.finish_reason)),
            "stop_reason": o.stop_reason,
        })
    }

    /// The stream choices of one engine output, each for a chunk of its own: reasoning,
    /// content and tool-call deltas as they settle, then the finish reason.
    pub fn stream_choices(&mut self, tok: &Tokenizer, out: &RequestOutput) -> Vec<Value> {
        let Some(parser) = self.reasoning else {
            return self.answer_choices(tok, out);
        };
        let mut answer = out.clone();
        let mut choices = Vec::new();
        let mut reasoning_delta = |index: usize, text: String| {
            if !text.is_empty() {
                choices.push(json!({"index": index, "delta": {"reasoning_content": text},
                    "logprobs": null, "finish_reason": null}));
            }
        };
        for d in &mut answer.deltas {
            let stream = self
                .thinking
                .entry(d.index)
                .or_insert_with(|| ReasoningStream::new(parser));
            let (reasoning, content) = stream.push(&d.text_delta, d.finish_reason.is_some());
            reasoning_delta(d.index, reasoning);
            d.text_delta = content;
        }
        if answer.deltas.is_empty() {
            // Known only at the end (best_of > n): each output split whole.
            for o in answer.outputs.iter_mut().flatten() {
                let (reasoning, content) = parser.split(&o.text);
                reasoning_delta(o.index, reasoning.unwrap_or_default());
                o.text = content;
            }
        }
        choices.extend(self.answer_choices(tok, &answer));
        choices
    }

    /// `stream_choices` of the answer alone.
    fn answer_choices(&mut self, tok: &Tokenizer, out: &RequestOutput) -> Vec<Value> {
        let Some(plan) = self.plan.clone() else {
            return chat_stream_choices(self.names(tok), out, &mut self.usage);
        };
        if out.finished() {
            self.usage.add_prompt(out);
        }
        type Piece<'a> = (usize, &'a str, Value, Option<(&'static str, Value)>);
        let mut pieces: Vec<Piece> = Vec::new();
        for d in &out.deltas {
            self.usage.completion += d.new_token_ids.len();
            let names = self.names(tok);
            let logprobs = (!d.logprobs.is_empty()).then(|| chat_logprobs(names, &d.logprobs));
            let reason = d
                .finish_reason
                .map(|r| (finish_reason(r), json!(d.stop_reason)));
            pieces.push((d.index, &d.text_delta, json!(logprobs), reason));
        }
        if out.deltas.is_empty() {
            // Known only at the end (best_of > n): each output as one piece.
            for o in out.outputs.iter().flatten() {
                self.usage.completion += o.token_ids.len();
                pieces.push((
                    o.index,
                    &o.text,
                    Value::Null,
                    Some((finish_reason(o.finish_reason), json!(o.stop_reason))),
                ));
            }
        }
        let mut choices = Vec::new();
        for (index, text, logprobs, reason) in pieces {
            if !self.streams.contains_key(&index) {
                let fresh = self.fresh(&plan, index);
                self.streams.insert(index, fresh);
            }
            let Some(stream) = self.streams.get_mut(&index) else {
                continue;
            };
            let delta = stream.push(text, reason.is_some());
            if !delta.content.is_empty() || !logprobs.is_null() {
                choices.push(json!({"index": index, "delta": {"content": delta.content},
                    "logprobs": logprobs, "finish_reason": null}));
            }
            if !delta.tool_calls.is_empty() {
                choices.push(
                    json!({"index": index, "delta": {"tool_calls": delta.tool_calls},
                    "logprobs": null, "finish_reason": null}),
                );
            }
            if let Some((r, stop_reason)) = reason {
                choices.push(json!({"index": index, "delta": {}, "logprobs": null,
                    "finish_reason": stream.finish_reason(r), "stop_reason": stop_reason}));
            }
        }
        choices
    }
}
