//! `POST /v1/completions`: one engine request per prompt, `n` choices each (indexed
//! `prompt * n + choice`), as one JSON body or as OpenAI's SSE chunks.

use std::convert::Infallible;
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt};
use infer_core::{CompletionOutput, TokenLogprobs};
use serde_json::{json, Value};
use warp::reply::{Reply, Response};

use crate::api::{CompletionRequest, Usage};
use crate::engine_loop::{Event, Events};
use crate::errors::ApiError;
use crate::state::{finish_reason, unix_now, ServerState};

const OBJECT: &str = "text_completion";

/// OpenAI's legacy completion logprobs: tokens, their logprobs, top alternatives and text
/// offsets. With `echo`, the prompt's tokens come first (the first has no logprob), as
/// lm-evaluation-harness's loglikelihood requests read them.
fn completion_logprobs(
    state: &ServerState,
    prompt: &[Option<TokenLogprobs>],
    prompt_ids: &[u32],
    generated: &[TokenLogprobs],
) -> Value {
    let piece = |id: u32| state.tokenizer.decode(&[id], false).unwrap_or_default();
    let mut offset = 0;
    let (mut tokens, mut logprobs, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    let mut push = |id: u32, lp: Option<&TokenLogprobs>| {
        let text = piece(id);
        offsets.push(offset);
        offset += text.len();
        tokens.push(text);
        logprobs.push(lp.map_or(Value::Null, |l| json!(l.logprob)));
        let top = lp.map_or(Value::Null, |l| {
            let top: serde_json::Map<String, Value> = l
                .top_logprobs
                .iter()
                .map(|t| (piece(t.token_id), json!(t.logprob)))
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

/// A request's last output.
pub struct Finished {
    pub outputs: Vec<CompletionOutput>,
    pub prompt_len: usize,
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
}

/// Waits for a request's last output.
pub async fn finish(mut events: Events) -> Result<Finished, ApiError> {
    while let Some(ev) = events.recv().await {
        match ev {
            Event::Output(out) => {
                if let Some(outputs) = out.outputs {
                    return Ok(Finished {
                        outputs,
                        prompt_len: out.metrics.num_prompt_tokens,
                        prompt_logprobs: out.prompt_logprobs,
                    });
                }
            }
            Event::Failed(why) => {
                return Err(ApiError::new(
                    warp::http::StatusCode::INTERNAL_SERVER_ERROR,
                    why,
                ))
            }
        }
    }
    Err(ApiError::new(
        warp::http::StatusCode::INTERNAL_SERVER_ERROR,
        "the request ended without output",
    ))
}

pub async fn handle(state: Arc<ServerState>, req: CompletionRequest) -> Response {
    match run(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(state: Arc<ServerState>, req: CompletionRequest) -> Result<Response, ApiError> {
    state.check_model(req.model.as_deref())?;
    let prompts = state.encode_prompts(&req.prompt)?;
    if req.echo && req.sampling.stream && req.logprobs.is_some() {
        return Err(ApiError::bad_request(
            "`echo` with `logprobs` is not supported when streaming; send `stream: false`",
        )
        .param("echo"));
    }
    // `echo` with `max_tokens: 0` scores the prompt alone: the engine generates one token
    // (prompt logprobs come with the first) and the reply drops it.
    let prompt_only = req.echo && req.max_tokens == Some(0);
    let max_tokens = Some(if prompt_only {
        1
    } else {
        req.max_tokens.unwrap_or(16)
    });
    let mut params = req.sampling.to_params(max_tokens, req.logprobs)?;
    if req.echo && req.logprobs.is_some() {
        params.prompt_logprobs = req.logprobs;
    }
    params.validate()?;
    for p in &prompts {
        state.check_length(p.len(), max_tokens)?;
    }
    let id = state.request_id("cmpl");
    let mut streams = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        streams.push(
            state
                .engine
                .submit(format!("{id}-{i}"), p.clone(), params.clone())
                .await?,
        );
    }
    let n = params.n;
    if req.sampling.stream {
        let usage = req.sampling.include_usage();
        // `echo` streams each choice's prompt text first, as vLLM does.
        let mut echoed = Vec::new();
        for (i, p) in prompts.iter().enumerate().filter(|_| req.echo) {
            let text = state.tokenizer.decode(p, false).map_err(ApiError::from)?;
            echoed.extend((0..n).map(|j| json!({"index": i * n + j, "text": text, "logprobs": null, "finish_reason": null})));
        }
        let head: Vec<_> = echoed
            .into_iter()
            .map(|c| sse_data(&chunk(&state, &id, OBJECT, json!([c]), None).to_string()))
            .collect();
        let body = sse_stream(state.clone(), id, streams, n, usage);
        return Ok(sse_reply(stream::iter(head).chain(body)));
    }
    let (mut choices, mut prompt_tokens, mut completion_tokens) = (Vec::new(), 0, 0);
    for (i, events) in streams.into_iter().enumerate() {
        let done = finish(events).await?;
        prompt_tokens += done.prompt_len;
        let (prompt_text, prompt_ids) = if req.echo {
            let text = state.tokenizer.decode(&prompts[i], false);
            (text.map_err(ApiError::from)?, &prompts[i][..])
        } else {
            (String::new(), &[][..])
        };
        let prompt_lps = done.prompt_logprobs.unwrap_or_default();
        for mut o in done.outputs {
            if prompt_only {
                o.text.clear();
                o.token_ids.clear();
                o.logprobs = o.logprobs.map(|_| Vec::new());
            }
            completion_tokens += o.token_ids.len();
            let logprobs = o
                .logprobs
                .as_ref()
                .map(|lps| completion_logprobs(&state, &prompt_lps, prompt_ids, lps));
            choices.push(json!({
                "index": i * n + o.index,
                "text": format!("{prompt_text}{}", o.text),
                "logprobs": logprobs,
                "finish_reason": if prompt_only { "length" } else { finish_reason(o.finish_reason) },
                "stop_reason": o.stop_reason.as_ref().map(|s| format!("{s:?}")),
            }));
        }
    }
    let body = json!({
        "id": id,
        "object": "text_completion",
        "created": unix_now(),
        "model": state.model_name,
        "choices": choices,
        "usage": Usage::new(prompt_tokens, completion_tokens),
    });
    Ok(warp::reply::json(&body).into_response())
}

/// One streamed chunk (`object`: `text_completion` or `chat.completion.chunk`).
pub fn chunk(
    state: &ServerState,
    id: &str,
    object: &str,
    choices: Value,
    usage: Option<Usage>,
) -> Value {
    json!({
        "id": id,
        "object": object,
        "created": unix_now(),
        "model": state.model_name,
        "choices": choices,
        "usage": usage,
    })
}

/// (prompt, completion) tokens counted while streaming.
pub type UsageCount = Arc<std::sync::Mutex<(usize, usize)>>;

/// The end of a stream: the usage chunk when asked, then `[DONE]`.
pub fn sse_tail(
    state: Arc<ServerState>,
    id: String,
    object: &'static str,
    usage: Option<UsageCount>,
) -> impl Stream<Item = Result<String, Infallible>> + Send + Sync + 'static {
    stream::once(async move {
        let mut events = Vec::new();
        if let Some(usage) = usage {
            let (p, c) = *usage.lock().unwrap_or_else(|e| e.into_inner());
            let u = chunk(&state, &id, object, json!([]), Some(Usage::new(p, c)));
            events.push(sse_data(&u.to_string()));
        }
        events.push(sse_data("[DONE]"));
        stream::iter(events)
    })
    .flatten()
}

/// One SSE event as OpenAI writes it.
pub fn sse_data(data: &str) -> Result<String, Infallible> {
    Ok(format!("data: {data}\n\n"))
}

/// A `text/event-stream` response over `events`.
pub fn sse_reply(
    events: impl Stream<Item = Result<String, Infallible>> + Send + Sync + 'static,
) -> Response {
    let mut r = warp::reply::stream(events).into_response();
    let h = r.headers_mut();
    h.insert(
        "content-type",
        warp::http::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        "cache-control",
        warp::http::HeaderValue::from_static("no-cache"),
    );
    r
}

/// SSE: a chunk per sequence delta (or per finished output for requests that only know their
/// outputs at the end), a usage chunk when asked, then `[DONE]`. Dropping the stream (the client
/// went away) drops the event receivers, which aborts the requests.
fn sse_stream(
    state: Arc<ServerState>,
    id: String,
    streams: Vec<Events>,
    n: usize,
    include_usage: bool,
) -> impl Stream<Item = Result<String, Infallible>> + Send + Sync + 'static {
    let tagged = streams.into_iter().enumerate().map(|(i, rx)| {
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(move |ev| (i, ev))
    });
    let merged = stream::select_all(tagged);
    let usage: UsageCount = Arc::default();
    let (st, id2, usage2) = (state.clone(), id.clone(), usage.clone());
    let body = merged.map(move |(i, ev)| {
        let choices: Vec<Value> = match ev {
            Event::Failed(why) => vec![json!({"index": i * n, "text": "", "finish_reason": "error", "error": why})],
            Event::Output(out) => {
                let mut u = usage2.lock().unwrap_or_else(|e| e.into_inner());
                if !out.deltas.is_empty() {
                    if out.finished() {
                        u.0 += out.metrics.num_prompt_tokens;
                    }
                    out.deltas
                        .iter()
                        .map(|d| {
                            u.1 += d.new_token_ids.len();
                            json!({
                                "index": i * n + d.index,
                                "text": d.text_delta,
                                "logprobs": (!d.logprobs.is_empty()).then(|| completion_logprobs(&st, &[], &[], &d.logprobs)),
                                "finish_reason": d.finish_reason.map(finish_reason),
                            })
                        })
                        .collect()
                } else {
                    u.0 += out.metrics.num_prompt_tokens;
                    out.outputs
                        .iter()
                        .flatten()
                        .map(|o| {
                            u.1 += o.token_ids.len();
                            json!({"index": i * n + o.index, "text": o.text, "logprobs": null, "finish_reason": finish_reason(o.finish_reason)})
                        })
                        .collect()
                }
            }
        };
        sse_data(&chunk(&st, &id2, OBJECT, Value::Array(choices), None).to_string())
    });
    let tail = sse_tail(state, id, OBJECT, include_usage.then_some(usage));
    body.chain(tail)
}
