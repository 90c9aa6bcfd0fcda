//! `POST /v1/responses`: OpenAI's Responses API over the chat path (`infer_api::responses`):
//! one engine request, answered as a response object or as its stream of typed events
//! (`response.created`, `response.output_text.delta`, ..., `response.completed`).

use std::convert::Infallible;
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt};
use infer_api::prepare::PreparedChat;
use infer_api::responses::{output_items, response, to_chat, ResponseStream, ResponsesRequest};
use infer_api::tools::ChatReplies;
use serde_json::{json, Value};
use warp::reply::{Reply as _, Response};

use crate::api::Usage;
use crate::body::Parsed;
use crate::engine_loop::{Event, Events};
use crate::errors::ApiError;
use crate::filters::blocking;
use crate::finished::finish;
use crate::sse::sse_reply;
use crate::state::{unix_now, ServerState};

pub async fn handle(state: Arc<ServerState>, req: Parsed<ResponsesRequest>) -> Response {
    match run(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// One SSE event with its type on the `event:` line, as OpenAI sends them.
fn sse_event((kind, data): (String, Value)) -> Result<String, Infallible> {
    Ok(format!("event: {kind}\ndata: {data}\n\n"))
}

async fn run(state: Arc<ServerState>, req: Parsed<ResponsesRequest>) -> Result<Response, ApiError> {
    let s = state.clone();
    let Parsed { value: req, slot } = req;
    let (req, prepared) = blocking(move || {
        let prepared = to_chat(&req).and_then(|chat| s.served().chat(&chat));
        drop(slot);
        (req, prepared)
    })
    .await?;
    let PreparedChat {
        prompt,
        params,
        structured_param,
        tools,
        echo: _,
    } = prepared?;
    if params.n != 1 {
        return Err(ApiError(
            infer_api::RequestError::bad_request("a response has one output: leave `n` out")
                .param("n"),
        ));
    }
    let reply = state.reply("resp", None);
    let id = reply.id.trim_start_matches("resp-").to_string();
    let replies = ChatReplies::new(tools, &reply.id).with_reasoning(state.reasoning_parser);
    let events = state
        .engine
        .submit(reply.id.clone(), prompt, params)
        .await
        .map_err(|e| ApiError::from(e).structured_param(structured_param))?;
    let created = unix_now();
    if req.stream {
        return Ok(sse_reply(event_stream(
            state, req, id, created, replies, events,
        )));
    }
    let done = finish(events).await?;
    let Some(o) = done.outputs.first() else {
        return Err(ApiError::new(
            warp::http::StatusCode::INTERNAL_SERVER_ERROR,
            "the request ended without output",
        ));
    };
    let choice = replies.choice(&state.tokenizer, o);
    let usage = Usage::new(done.prompt_len, o.token_ids.len()).with_cached(done.cached);
    let body = response(
        &req,
        &id,
        created,
        &state.model_name,
        output_items(&id, &choice["message"]),
        choice["finish_reason"].as_str(),
        Some(usage),
    );
    Ok(warp::reply::json(&body).into_response())
}

fn event_stream(
    state: Arc<ServerState>,
    req: ResponsesRequest,
    id: String,
    created: u64,
    mut replies: ChatReplies,
    events: Events,
) -> impl Stream<Item = Result<String, Infallible>> + Send + Sync + 'static {
    let mut out = ResponseStream::new(&id);
    let model = state.model_name.clone();
    let start = response(&req, &id, created, &model, vec![], None, None);
    let head = vec![
        out.event("response.created", json!({"response": start.clone()})),
        out.event("response.in_progress", json!({"response": start})),
    ];
    let out = Arc::new(std::sync::Mutex::new(out));
    let state_body = state.clone();
    let out_body = out.clone();
    let finish_reason = Arc::new(std::sync::Mutex::new(None::<String>));
    let reason_body = finish_reason.clone();
    let usage = Arc::new(std::sync::Mutex::new((0usize, 0usize, 0usize)));
    let usage_body = usage.clone();
    let body = tokio_stream::wrappers::UnboundedReceiverStream::new(events).map(move |ev| {
        let mut out = out_body.lock().unwrap_or_else(|e| e.into_inner());
        match ev {
            Event::Failed { message, .. } => {
                vec![out.event("error", json!({"code": "server_error", "message": message}))]
            }
            Event::Output(o) => {
                if o.finished() {
                    let mut u = usage_body.lock().unwrap_or_else(|e| e.into_inner());
                    u.0 = o.metrics.num_prompt_tokens;
                    u.2 = o.metrics.num_cached_tokens.unwrap_or(0);
                }
                let choices = replies.stream_choices(&state_body.tokenizer, &o);
                let mut events = Vec::new();
                for c in &choices {
                    events.extend(out.push(c));
                    if let Some(r) = c["finish_reason"].as_str() {
                        *reason_body.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(r.to_string());
                    }
                }
                let mut u = usage_body.lock().unwrap_or_else(|e| e.into_inner());
                u.1 += o
                    .deltas
                    .iter()
                    .map(|d| d.new_token_ids.len())
                    .sum::<usize>();
                events
            }
        }
    });
    let tail = stream::once(async move {
        let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
        let (mut events, items) = out.finish();
        let (prompt, completion, cached) = *usage.lock().unwrap_or_else(|e| e.into_inner());
        let reason = finish_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let usage = Usage::new(prompt, completion).with_cached(cached);
        let done = response(
            &req,
            &id,
            created,
            &model,
            items,
            Some(reason.as_deref().unwrap_or("stop")),
            Some(usage),
        );
        let kind = if done["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        events.push(out.event(kind, json!({"response": done})));
        stream::iter(events)
    })
    .flatten();
    stream::iter(head)
        .chain(body.flat_map(stream::iter))
        .chain(tail)
        .map(sse_event)
}
