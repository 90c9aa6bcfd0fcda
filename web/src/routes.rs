//! The routes: OpenAI's `/v1/*` (behind the API key when one is set), tokenize / detokenize,
//! health, version, metrics, and the chat page at `/`. Every rejection becomes an OpenAI error body (`errors::recover`).

use std::convert::Infallible;
use std::sync::Arc;

use serde_json::json;
use warp::http::StatusCode;
use warp::reply::{Reply, Response};
use warp::Filter;

use crate::api::{ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest};
use crate::errors::{recover, ApiError};
use crate::state::ServerState;
use crate::{chat, completions};

/// Request bodies above this are refused with 413.
pub const MAX_BODY_BYTES: u64 = 8 << 20;

fn with_state(
    state: Arc<ServerState>,
) -> impl Filter<Extract = (Arc<ServerState>,), Error = Infallible> + Clone {
    warp::any().map(move || state.clone())
}

fn json_body<T: serde::de::DeserializeOwned + Send>(
) -> impl Filter<Extract = (T,), Error = warp::Rejection> + Clone {
    warp::body::content_length_limit(MAX_BODY_BYTES).and(warp::body::json())
}

/// `Authorization: Bearer KEY` when the server has a key.
fn auth(key: Option<String>) -> impl Filter<Extract = (), Error = warp::Rejection> + Clone {
    warp::header::optional::<String>("authorization")
        .and_then(move |header: Option<String>| {
            let key = key.clone();
            async move {
                match key {
                    None => Ok(()),
                    Some(k) if header.as_deref() == Some(&format!("Bearer {k}")) => Ok(()),
                    Some(_) => Err(warp::reject::custom(ApiError::new(
                        StatusCode::UNAUTHORIZED,
                        "missing or wrong API key (send `Authorization: Bearer KEY`)",
                    ))),
                }
            }
        })
        .untuple_one()
}

pub fn routes(
    state: Arc<ServerState>,
    api_key: Option<String>,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone {
    let health = warp::path!("health")
        .and(warp::get())
        .map(|| warp::reply().into_response());
    let version = warp::path!("version")
        .and(warp::get())
        .map(|| warp::reply::json(&json!({"version": env!("CARGO_PKG_VERSION")})).into_response());
    let model_card = |s: &ServerState| {
        json!({
            "id": s.model_name,
            "object": "model",
            "created": s.started,
            "owned_by": "infer",
            "root": s.model_name,
            "max_model_len": s.max_model_len,
        })
    };
    let models = warp::path!("v1" / "models")
        .and(warp::get())
        .and(with_state(state.clone()))
        .map(move |s: Arc<ServerState>| {
            warp::reply::json(&json!({"object": "list", "data": [model_card(&s)]})).into_response()
        });
    // Model ids may hold slashes (`org/name`): the rest of the path is the id.
    let model = warp::path!("v1" / "models" / ..)
        .and(warp::path::tail())
        .and(warp::get())
        .and(with_state(state.clone()))
        .map(move |id: warp::path::Tail, s: Arc<ServerState>| {
            match s.served().check_model(Some(id.as_str())) {
                Ok(()) => warp::reply::json(&model_card(&s)).into_response(),
                Err(e) => ApiError::from(e).into_response(),
            }
        });
    let tokenizer_info = warp::path!("tokenizer_info")
        .and(warp::get())
        .and(with_state(state.clone()))
        .map(|s: Arc<ServerState>| warp::reply::json(&s.served().tokenizer_info()).into_response());
    let completions = warp::path!("v1" / "completions")
        .and(warp::post())
        .and(with_state(state.clone()))
        .and(json_body::<CompletionRequest>())
        .then(completions::handle);
    let chat = warp::path!("v1" / "chat" / "completions")
        .and(warp::post())
        .and(with_state(state.clone()))
        .and(json_body::<ChatRequest>())
        .then(chat::handle);
    let tokenize = warp::path!("tokenize")
        .and(warp::post())
        .and(with_state(state.clone()))
        .and(json_body::<TokenizeRequest>())
        .map(
            |s: Arc<ServerState>, r: TokenizeRequest| match s.served().tokenize(&r) {
                Ok(reply) => warp::reply::json(&reply).into_response(),
                Err(e) => ApiError::from(e).into_response(),
            },
        );
    let detokenize = warp::path!("detokenize")
        .and(warp::post())
        .and(with_state(state.clone()))
        .and(json_body::<DetokenizeRequest>())
        .map(
            |s: Arc<ServerState>, r: DetokenizeRequest| match s.served().detokenize(&r) {
                Ok(reply) => warp::reply::json(&reply).into_response(),
                Err(e) => ApiError::from(e).into_response(),
            },
        );
    // Not behind the API key, as in vLLM: scrapers rarely carry one.
    let metrics = warp::path!("metrics")
        .and(warp::get())
        .and(with_state(state.clone()))
        .map(|s: Arc<ServerState>| {
            warp::reply::with_header(
                s.metrics.encode(),
                "content-type",
                "text/plain; version=0.0.4; charset=utf-8",
            )
            .into_response()
        });
    // The chat page: static files embedded at compile time (no build step, no file paths).
    let page = |body: &'static str, kind: &'static str| {
        move || warp::reply::with_header(body, "content-type", kind).into_response()
    };
    let index = warp::path::end().and(warp::get()).map(page(
        include_str!("../static/index.html"),
        "text/html; charset=utf-8",
    ));
    let script = warp::path!("static" / "chat.js").and(warp::get()).map(page(
        include_str!("../static/chat.js"),
        "text/javascript; charset=utf-8",
    ));
    let style = warp::path!("static" / "style.css")
        .and(warp::get())
        .map(page(
            include_str!("../static/style.css"),
            "text/css; charset=utf-8",
        ));
    let v1 = auth(api_key).and(
        models
            .or(model)
            .unify()
            .or(completions)
            .unify()
            .or(chat)
            .unify(),
    );
    let browser = crate::browser_page::routes(state.clone());
    health
        .or(version)
        .unify()
        .or(metrics)
        .unify()
        .or(index)
        .unify()
        .or(script)
        .unify()
        .or(style)
        .unify()
        .or(browser)
        .unify()
        .or(v1)
        .unify()
        .or(tokenize)
        .unify()
        .or(tokenizer_info)
        .unify()
        .or(detokenize)
        .unify()
        .recover(recover)
        .unify()
}
