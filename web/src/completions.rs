//! `POST /v1/completions`: one engine request per prompt, `n` choices each (indexed
//! `prompt * n + choice`), as one JSON body or as OpenAI's SSE chunks.

use std::convert::Infallible;
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt};
use infer_api::format::{
    completion_echo_choices, completion_stream_choices, CompletionReply, FinishedPrompt, Reply,
    RunningUsage, TokenNames, UsageCounter, COMPLETION as OBJECT,
};
use serde_json::{json, Value};
use warp::reply::{Reply as _, Response};

use crate::api::CompletionRequest;
use crate::body::Parsed;
use crate::engine_loop::{Event, Events, NewRequest};
use crate::errors::ApiError;
use crate::filters::blocking;
use crate::finished::finish;
use crate::sse::{sse_data, sse_reply, sse_tail, UsageRead};
use crate::state::ServerState;

pub async fn handle(state: Arc<ServerState>, req: Parsed<CompletionRequest>) -> Response {
    match run(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(
    state: Arc<ServerState>,
    req: Parsed<CompletionRequest>,
) -> Result<Response, ApiError> {
    let s = state.clone();
    let Parsed { value: req, slot } = req;
    let (req, prepared) = blocking(move || {
        let prepared = s.served().completion(&req);
        drop(slot);
        (req, prepared)
    })
    .await?;
    let prepared = prepared?;
    let (prompts, params) = (&prepared.prompts, &prepared.params);
    let reply = state.reply("cmpl", req.sampling.request_id.as_deref());
    // All prompts are admitted together or the request is refused before any is computed.
    let requests = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| NewRequest {
            id: format!("{}-{i}", reply.id),
            prompt: p.clone(),
            params: params.clone(),
        })
        .collect();
    let streams = state
        .engine
        .submit_all(requests)
        .await
        .map_err(|e| ApiError::from(e).structured_param(prepared.structured_param))?;
    let n = params.n;
    if req.sampling.stream {
        let usage = req.sampling.include_usage();
        // `echo` streams each choice's prompt text first, as vLLM does.
        let echoed = if req.echo {
            completion_echo_choices(&state.tokenizer, prompts, n).map_err(ApiError::from)?
        } else {
            Vec::new()
        };
        let head: Vec<_> = echoed
            .into_iter()
            .map(|c| sse_data(&reply.chunk(OBJECT, json!([c]), None).to_string()))
            .collect();
        let running = req
            .sampling
            .continuous_usage()
            .then(|| RunningUsage::new(prompts.iter().map(Vec::len).collect()));
        let token_ids = state.token_ids(req.sampling.return_tokens_as_token_ids);
        let body = sse_stream(state.clone(), reply, streams, n, usage, running, token_ids);
        return Ok(sse_reply(stream::iter(head).chain(body)));
    }
    let mut finished = Vec::with_capacity(streams.len());
    for events in streams {
        let done = finish(events).await?;
        finished.push(FinishedPrompt {
            outputs: done.outputs,
            prompt_len: done.prompt_len,
            cached: done.cached,
            prompt_logprobs: done.prompt_logprobs.unwrap_or_default(),
        });
    }
    let builder = CompletionReply {
        n,
        echo: req.echo,
        prompt_only: prepared.prompt_only,
        prompt_logprobs: prepared.prompt_logprobs,
        token_ids: state.token_ids(req.sampling.return_tokens_as_token_ids),
    };
    let (choices, usage) = builder.choices(&state.tokenizer, prompts, finished)?;
    Ok(warp::reply::json(&reply.response(OBJECT, choices, usage)).into_response())
}

/// (prompt, completion) tokens counted while streaming.
pub type UsageCount = Arc<std::sync::Mutex<UsageCounter>>;

/// SSE: a chunk per sequence delta (or per finished output for requests that only know their
/// outputs at the end), a usage chunk when asked, then `[DONE]`. Dropping the stream (the client
/// went away) drops the event receivers, which aborts the requests.
fn sse_stream(
    state: Arc<ServerState>,
    reply: Reply,
    streams: Vec<Events>,
    n: usize,
    include_usage: bool,
    mut running: Option<RunningUsage>,
    token_ids: bool,
) -> impl Stream<Item = Result<String, Infallible>> + Send + Sync + 'static {
    let tagged = streams.into_iter().enumerate().map(|(i, rx)| {
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(move |ev| (i, ev))
    });
    let merged = stream::select_all(tagged);
    let usage: UsageCount = Arc::default();
    let (reply2, usage2) = (reply.clone(), usage.clone());
    let body = merged.map(move |(i, ev)| {
        if let (Some(r), Event::Output(out)) = (running.as_mut(), &ev) {
            r.add(i, out);
        }
        let chunk_usage = running.as_ref().map(|r| r.usage(i));
        let choices: Vec<Value> = match ev {
            Event::Failed { message: why, .. } => {
                vec![json!({"index": i * n, "text": "", "finish_reason": "error", "error": why})]
            }
            Event::Output(out) => {
                let mut u = usage2.lock().unwrap_or_else(|e| e.into_inner());
                let names = TokenNames::new(&state.tokenizer, token_ids);
                completion_stream_choices(names, &out, i, n, &mut u)
            }
        };
        sse_data(
            &reply2
                .chunk(OBJECT, Value::Array(choices), chunk_usage)
                .to_string(),
        )
    });
    let read: UsageRead = Box::new(move || usage.lock().unwrap_or_else(|e| e.into_inner()).usage());
    let tail = sse_tail(reply, OBJECT, include_usage.then_some(read));
    body.chain(tail)
}
