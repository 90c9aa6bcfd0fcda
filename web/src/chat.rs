//! `POST /v1/chat/completions`: messages rendered with the model's chat template, then one
//! engine request with `n` choices, as one JSON body or as SSE chunks (`role` first, then
//! `content` deltas, then the finish reason).

use std::convert::Infallible;
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt};
use infer_core::{ChatMessage, TokenLogprobs};
use serde_json::{json, Value};
use warp::reply::{Reply, Response};

use crate::api::{ChatRequest, Usage};
use crate::completions::{self, finish, sse_data, sse_reply, sse_tail, UsageCount};
use crate::engine_loop::{Event, Events};
use crate::errors::ApiError;
use crate::state::{finish_reason, unix_now, ServerState};

/// OpenAI's chat logprobs: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(state: &ServerState, lps: &[TokenLogprobs]) -> Value {
    let entry = |id: u32, logprob: f32| {
        let token = state.tokenizer.decode(&[id], false).unwrap_or_default();
        json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
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

pub async fn handle(state: Arc<ServerState>, req: ChatRequest) -> Response {
    match run(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(state: Arc<ServerState>, req: ChatRequest) -> Result<Response, ApiError> {
    state.check_model(req.model.as_deref())?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("`messages` is empty").param("messages"));
    }
    let messages: Vec<ChatMessage> = req
        .messages
        .iter()
        .map(|m| ChatMessage {
            role: m.role.clone(),
            content: m.content.clone().unwrap_or_default(),
        })
        .collect();
    let text = state
        .tokenizer
        .apply_chat_template(&messages, req.add_generation_prompt.unwrap_or(true))?;
    // The rendered template already holds its special tokens.
    let prompt = state.tokenizer.encode(&text, false)?;
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    let logprobs = req.logprobs.then(|| req.top_logprobs.unwrap_or(0));
    let params = req.sampling.to_params(max_tokens, logprobs)?;
    params.validate()?;
    state.check_length(prompt.len(), max_tokens)?;
    let id = state.request_id("chatcmpl");
    let events = state
        .engine
        .submit(id.clone(), prompt, params.clone())
        .await?;
    if req.sampling.stream {
        let usage = req.sampling.include_usage();
        return Ok(sse_reply(chat_stream(state, id, events, params.n, usage)));
    }
    let done = finish(events).await?;
    let (outputs, prompt_tokens) = (done.outputs, done.prompt_len);
    let completion_tokens = outputs.iter().map(|o| o.token_ids.len()).sum();
    let choices: Vec<Value> = outputs
        .iter()
        .map(|o| {
            json!({
                "index": o.index,
                "message": {"role": "assistant", "content": o.text},
                "logprobs": o.logprobs.as_ref().map(|l| chat_logprobs(&state, l)),
                "finish_reason": finish_reason(o.finish_reason),
            })
        })
        .collect();
    let body = json!({
        "id": id,
        "object": "chat.completion",
        "created": unix_now(),
        "model": state.model_name,
        "choices": choices,
        "usage": Usage::new(prompt_tokens, completion_tokens),
    });
    Ok(warp::reply::json(&body).into_response())
}

const CHUNK: &str = "chat.completion.chunk";

fn chunk(state: &ServerState, id: &str, choices: Value, usage: Option<Usage>) -> String {
    completions::chunk(state, id, CHUNK, choices, usage).to_string()
}

fn chat_stream(
    state: Arc<ServerState>,
    id: String,
    events: Events,
    n: usize,
    include_usage: bool,
) -> impl Stream<Item = Result<String, Infallible>> + Send + Sync + 'static {
    let roles: Vec<Value> = (0..n)
        .map(|i| json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}))
        .collect();
    let head = stream::once(std::future::ready(sse_data(&chunk(
        &state,
        &id,
        Value::Array(roles),
        None,
    ))));
    let usage: UsageCount = Arc::default();
    let (st, id2, u2) = (state.clone(), id.clone(), usage.clone());
    let body = tokio_stream::wrappers::UnboundedReceiverStream::new(events).map(move |ev| {
        let choices: Vec<Value> = match ev {
            Event::Failed(why) => vec![json!({"index": 0, "delta": {}, "finish_reason": "error", "error": why})],
            Event::Output(out) => {
                let mut u = u2.lock().unwrap_or_else(|e| e.into_inner());
                if out.finished() {
                    u.0 = out.metrics.num_prompt_tokens;
                }
                let mut choices = Vec::new();
                for d in &out.deltas {
                    u.1 += d.new_token_ids.len();
                    if !d.text_delta.is_empty() || !d.logprobs.is_empty() {
                        choices.push(json!({
                            "index": d.index,
                            "delta": {"content": d.text_delta},
                            "logprobs": (!d.logprobs.is_empty()).then(|| chat_logprobs(&st, &d.logprobs)),
                            "finish_reason": null,
                        }));
                    }
                    if let Some(r) = d.finish_reason {
                        choices.push(json!({"index": d.index, "delta": {}, "logprobs": null, "finish_reason": finish_reason(r)}));
                    }
                }
                if out.deltas.is_empty() {
                    // Known only at the end (best_of > n): each output as one delta.
                    for o in out.outputs.iter().flatten() {
                        u.1 += o.token_ids.len();
                        choices.push(json!({"index": o.index, "delta": {"content": o.text}, "logprobs": null, "finish_reason": finish_reason(o.finish_reason)}));
                    }
                }
                choices
            }
        };
        choices
            .into_iter()
            .map(|c| sse_data(&chunk(&st, &id2, json!([c]), None)))
            .collect::<Vec<_>>()
    });
    let body = body.flat_map(stream::iter);
    let tail = sse_tail(state, id, CHUNK, include_usage.then_some(usage));
    head.chain(body).chain(tail)
}
