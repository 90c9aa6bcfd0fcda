//! Server-sent events as OpenAI writes them: `data: ...` events, the usage chunk and `[DONE]`
//! at the end, and the `text/event-stream` response (completions, chat and responses).

use std::convert::Infallible;

use futures_util::stream::{self, Stream, StreamExt};
use infer_api::format::Reply;
use serde_json::json;
use warp::reply::{Reply as _, Response};

use crate::api::Usage;

/// Reads a stream's usage once its last chunk went out.
pub type UsageRead = Box<dyn FnOnce() -> Usage + Send + Sync>;

/// The end of a stream: the usage chunk when asked, then `[DONE]`.
pub fn sse_tail(
    reply: Reply,
    object: &'static str,
    usage: Option<UsageRead>,
) -> impl Stream<Item = Result<String, Infallible>> + Send + Sync + 'static {
    stream::once(async move {
        let mut events = Vec::new();
        if let Some(usage) = usage {
            let u = reply.chunk(object, json!([]), Some(usage()));
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
