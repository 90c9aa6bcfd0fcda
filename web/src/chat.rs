//! `POST /v1/chat/completions`: messages rendered with the model's chat template, then one
//! engine request with `n` choices, as one JSON body or as SSE chunks (`role` first, then
//! `content` and `tool_calls` deltas, then the finish reason).

use std::convert::Infallible;
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt};
use infer_api::format::{prompt_logprobs, Reply, RunningUsage, CHAT, CHAT_CHUNK};
use infer_api::prepare::PreparedChat;
use infer_api::tools::ChatReplies;
use serde_json::{json, Value};
use warp::reply::{Reply as _, Response};

use crate::api::{ChatRequest, Usage};
use crate::body::Parsed;
use crate::engine_loop::{Event, Events};
use crate::errors::ApiError;
use crate::filters::blocking;
use crate::finished::finish;
use crate::sse::{sse_data, sse_reply, sse_tail, UsageRead};
use crate::state::ServerState;

pub async fn handle(state: Arc<ServerState>, req: Parsed<ChatRequest>) -> Response {
    match run(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(state: Arc<ServerState>, req: Parsed<ChatRequest>) -> Result<Response, ApiError> {
    // Rendering and tokenizing run on the blocking pool (a huge prompt must not stall others),
    // within the request's preparation slot.
    let s = state.clone();
    let Parsed { value: req, slot } = req;
    let (req, prepared) = blocking(move || {
        let prepared = s.served().chat(&req);
        drop(slot);
        (req, prepared)
    })
    .await?;
    let PreparedChat {
        prompt,
        params,
        structured_param,
        tools,
        echo,
    } = prepared?;
    let reply = state.reply("chatcmpl", req.sampling.request_id.as_deref());
    let replies = ChatReplies::new(tools, &reply.id)
        .with_echo(echo)
        .with_reasoning(state.reasoning_parser)
        .with_token_ids(state.token_ids(req.sampling.return_tokens_as_token_ids));
    let running = req
        .sampling
        .continuous_usage()
        .then(|| RunningUsage::new(vec![prompt.len()]));
    let events = state
        .engine
        .submit(reply.id.clone(), prompt, params.clone())
        .await
        .map_err(|e| {
            let mut e = ApiError::from(e).structured_param(structured_param);
            // Chat asks for top logprobs as `top_logprobs` (`logprobs` is its switch).
            if e.0.param.as_deref() == Some("logprobs") {
                e.0.param = Some("top_logprobs".into());
            }
            e
        })?;
    if req.sampling.stream {
        let usage = req.sampling.include_usage();
        return Ok(sse_reply(chat_stream(
            state, reply, replies, events, params.n, usage, running,
        )));
    }
    let done = finish(events).await?;
    let completion_tokens = done.outputs.iter().map(|o| o.token_ids.len()).sum();
    let choices: Vec<Value> = done
        .outputs
        .iter()
        .map(|o| replies.choice(&state.tokenizer, o))
        .collect();
    let usage = Usage::new(done.prompt_len, completion_tokens).with_cached(done.cached);
    let mut body = reply.response(CHAT, choices, usage);
    if params.prompt_logprobs.is_some() {
        // vLLM puts a chat prompt's logprobs beside the choices.
        let lps = done.prompt_logprobs.unwrap_or_default();
        body["prompt_logprobs"] = prompt_logprobs(&state.tokenizer, &lps);
    }
    Ok(warp::reply::json(&body).into_response())
}

fn chat_stream(
    state: Arc<ServerState>,
    reply: Reply,
    replies: ChatReplies,
    events: Events,
    n: usize,
    include_usage: bool,
    mut running: Option<RunningUsage>,
) -> impl Stream<Item = Result<String, Infallible>> + Send + Sync + 'static {
    let roles = Value::Array(replies.role_choices(n));
    let first_usage = running.as_ref().map(|r| r.usage(0));
    let head = stream::once(std::future::ready(sse_data(
        &reply.chunk(CHAT_CHUNK, roles, first_usage).to_string(),
    )));
    let replies = Arc::new(std::sync::Mutex::new(replies));
    let (reply2, r2) = (reply.clone(), replies.clone());
    let body = tokio_stream::wrappers::UnboundedReceiverStream::new(events).map(move |ev| {
        if let (Some(r), Event::Output(out)) = (running.as_mut(), &ev) {
            r.add(0, out);
        }
        let usage = running.as_ref().map(|r| r.usage(0));
        let choices: Vec<Value> = match ev {
            Event::Failed { message: why, .. } => {
                vec![json!({"index": 0, "delta": {}, "finish_reason": "error", "error": why})]
            }
            Event::Output(out) => {
                let mut r = r2.lock().unwrap_or_else(|e| e.into_inner());
                r.stream_choices(&state.tokenizer, &out)
            }
        };
        choices
            .into_iter()
            .map(|c| sse_data(&reply2.chunk(CHAT_CHUNK, json!([c]), usage).to_string()))
            .collect::<Vec<_>>()
    });
    let body = body.flat_map(stream::iter);
    let read: UsageRead = Box::new(move || {
        let r = replies.lock().unwrap_or_else(|e| e.into_inner());
        r.usage.usage()
    });
    let tail = sse_tail(reply, CHAT_CHUNK, include_usage.then_some(read));
    head.chain(body).chain(tail)
}
