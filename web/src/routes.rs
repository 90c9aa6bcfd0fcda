//! The routes: OpenAI's `/v1/*` (behind the API key when one is set), tokenize / detokenize,
//! health, version, metrics, and the chat page at `/`. Every rejection becomes an OpenAI error body (`errors::recover`).

use std::sync::Arc;

use serde_json::json;
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::reply::{Reply, Response};
use warp::Filter;

use crate::api::{
    ChatRequest, CompletionRequest, DetokenizeRequest, RequestError, TokenizeRequest,
};
use crate::body::{self, Parsed};
use crate::errors::{recover, ApiError, ALLOWED_METHODS};
use crate::filters::{auth, blocking, get, with_state, Auth};
use crate::state::ServerState;
use crate::{chat, completions};

/// A tokenizer endpoint's answer, computed on the blocking pool: its JSON or its error.
async fn tokenizer_reply(
    f: impl FnOnce() -> Result<serde_json::Value, RequestError> + Send + 'static,
) -> Response {
    match blocking(f).await {
        Ok(Ok(reply)) => warp::reply::json(&reply).into_response(),
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /{name}` answered by `answer` on the blocking pool, within the body's preparation
/// slot.
fn tokenizer_route<R: serde::de::DeserializeOwned + Send + 'static>(
    name: &'static str,
    state: &Arc<ServerState>,
    auth: &Auth,
    answer: fn(&infer_api::prepare::Served<'_>, &R) -> Result<serde_json::Value, RequestError>,
) -> BoxedFilter<(Response,)> {
    warp::path(name)
        .and(warp::path::end())
        .and(warp::post())
        .and(auth.clone())
        .and(with_state(state.clone()))
        .and(body::json::<R>(state.budget.clone()))
        .then(move |s: Arc<ServerState>, r: Parsed<R>| {
            let Parsed { value: r, slot } = r;
            tokenizer_reply(move || {
                let reply = answer(&s.served(), &r);
                drop(slot);
                reply
            })
        })
        .boxed()
}

/// The API's fixed paths (the OpenAPI document lists them all).
const KNOWN_API_PATHS: &[&str] = &[
    "/health",
    "/version",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
    "/get_load",
];

/// Whether a path is one the server answers (OPTIONS on any other is a 404, as GET is).
fn known_path(path: &str) -> bool {
    // The chat page, the browser demo and this document.
    const PAGES: &[&str] = &["/", "/browser", "/openapi.json"];
    const UNDER: &[&str] = &["/v1/models/", "/static/", "/browser/"];
    KNOWN_API_PATHS.contains(&path)
        || PAGES.contains(&path)
        || UNDER.iter().any(|p| path.starts_with(p))
}

/// Lets a generation request through on a generating server; a pooling one (`--runner
/// pooling`) answers it as vLLM does, with a 400 saying the model does not support `api`.
fn generates(
    state: &Arc<ServerState>,
    api: &'static str,
) -> impl Filter<Extract = (), Error = warp::Rejection> + Clone {
    let pooling = state.pooling.is_some();
    warp::any()
        .and_then(move || async move {
            if pooling {
                Err(warp::reject::custom(ApiError::bad_request(format!(
                    "The model does not support {api} API: this server runs it as an embedding model (--runner pooling); use /v1/embeddings"
                ))))
            } else {
                Ok(())
            }
        })
        .untuple_one()
}

pub fn routes(state: Arc<ServerState>, api_key: Option<String>) -> BoxedFilter<(Response,)> {
    let cors = state.cors.clone();
    let auth = auth(api_key);
    let health = warp::path!("health")
        .and(get())
        .map(|| warp::reply().into_response());
    let version = warp::path!("version")
        .and(get())
        .map(|| warp::reply::json(&json!({"version": env!("CARGO_PKG_VERSION")})).into_response());
    let model_card = |s: &ServerState, id: &str| {
        json!({
            "id": id,
            "object": "model",
            "created": s.started,
            "owned_by": "infer",
            "root": s.model_name,
            "max_model_len": s.max_model_len,
        })
    };
    let models = warp::path!("v1" / "models")
        .and(get())
        .and(auth.clone())
        .and(with_state(state.clone()))
        .map(move |s: Arc<ServerState>| {
            // Every name the model answers to, the first (the replies' `model`) first.
            let cards: Vec<_> = std::iter::once(&s.model_name)
                .chain(&s.model_aliases)
                .map(|id| model_card(&s, id))
                .collect();
            warp::reply::json(&json!({"object": "list", "data": cards})).into_response()
        });
    // Model ids may hold slashes (`org/name`): the rest of the path is the id.
    let model = warp::path!("v1" / "models" / ..)
        .and(warp::path::tail())
        .and(get())
        .and(auth.clone())
        .and(with_state(state.clone()))
        .map(move |id: warp::path::Tail, s: Arc<ServerState>| {
            match s.served().check_model(Some(id.as_str())) {
                Ok(()) => warp::reply::json(&model_card(&s, id.as_str())).into_response(),
                Err(e) => ApiError::from(e).into_response(),
            }
        });
    // Behind the key: it holds the chat template.
    let tokenizer_info = warp::path!("tokenizer_info")
        .and(get())
        .and(auth.clone())
        .and(with_state(state.clone()))
        .map(|s: Arc<ServerState>| warp::reply::json(&s.served().tokenizer_info()).into_response());
    let completions = warp::path!("v1" / "completions")
        .and(warp::post())
        .and(auth.clone())
        .and(generates(&state, "Completions"))
        .and(with_state(state.clone()))
        .and(body::json::<CompletionRequest>(state.budget.clone()))
        .then(completions::handle);
    let chat = warp::path!("v1" / "chat" / "completions")
        .and(warp::post())
        .and(auth.clone())
        .and(generates(&state, "Chat Completions"))
        .and(with_state(state.clone()))
        .and(body::json::<ChatRequest>(state.budget.clone()))
        .then(chat::handle);
    let responses = warp::path!("v1" / "responses")
        .and(warp::post())
        .and(auth.clone())
        .and(generates(&state, "Responses"))
        .and(with_state(state.clone()))
        .and(body::json::<infer_api::responses::ResponsesRequest>(
            state.budget.clone(),
        ))
        .then(crate::responses::handle);
    let embeddings = warp::path!("v1" / "embeddings")
        .and(warp::post())
        .and(auth.clone())
        .and(with_state(state.clone()))
        .and(body::json::<infer_api::embeddings::EmbeddingRequest>(
            state.budget.clone(),
        ))
        .then(crate::embeddings::handle);
    // Behind the key too when one is set: tokenizing is work anyone could make the server do.
    let tokenize = tokenizer_route("tokenize", &state, &auth, |s, r: &TokenizeRequest| {
        s.tokenize(r)
    });
    let detokenize = tokenizer_route("detokenize", &state, &auth, |s, r: &DetokenizeRequest| {
        s.detokenize(r)
    });
    // Not behind the API key, as in vLLM (FastAPI serves it to anyone); off with
    // --disable-fastapi-docs, then a 404 like any unknown path.
    let openapi_on = state.openapi;
    let openapi = warp::path!("openapi.json")
        .and(get())
        .and_then(move || async move {
            if openapi_on {
                Ok(())
            } else {
                Err(warp::reject::not_found())
            }
        })
        .untuple_one()
        .map(|| {
            warp::reply::json(&infer_api::openapi::document(env!("CARGO_PKG_VERSION")))
                .into_response()
        });
    // Not behind the API key, as in vLLM: scrapers rarely carry one.
    let metrics = warp::path!("metrics")
        .and(get())
        .and(with_state(state.clone()))
        .map(|s: Arc<ServerState>| {
            warp::reply::with_header(
                s.metrics.encode(),
                "content-type",
                "text/plain; version=0.0.4; charset=utf-8",
            )
            .into_response()
        });
    let page = crate::chat_page::routes();
    // The key is checked after the path: an unknown path is a 404 with or without it.
    let v1 = models
        .or(model)
        .unify()
        .or(completions)
        .unify()
        .or(chat)
        .unify()
        .or(responses)
        .unify()
        .or(embeddings)
        .unify();
    // Without CORS configured, a preflight gets the methods and no CORS headers (the browser
    // then refuses the cross-origin call).
    // Matched by hand: `warp::options()` would turn every unknown GET path into a 405.
    let options = warp::method()
        .and(warp::path::full())
        .and_then(
            |m: warp::http::Method, path: warp::path::FullPath| async move {
                if m == warp::http::Method::OPTIONS && known_path(path.as_str()) {
                    Ok(())
                } else {
                    Err(warp::reject::not_found())
                }
            },
        )
        .untuple_one()
        .map(|| {
            let mut r =
                warp::reply::with_status(warp::reply(), StatusCode::NO_CONTENT).into_response();
            r.headers_mut().insert(
                "allow",
                warp::http::HeaderValue::from_static(ALLOWED_METHODS),
            );
            r
        });
    let browser = crate::browser_page::routes(state.clone(), auth.clone());
    let app = health
        .or(version)
        .unify()
        .or(crate::router_probes::routes(state.clone(), auth.clone()))
        .unify()
        .or(metrics)
        .unify()
        .or(openapi)
        .unify()
        .or(page)
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
        .or(options)
        .unify()
        .recover(recover)
        .unify();
    match cors {
        None => app.boxed(),
        // CORS wraps everything: it answers preflights and adds its headers to replies.
        Some(c) => app
            .with(c.filter())
            .map(Reply::into_response)
            .recover(recover)
            .unify()
            .boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::{known_path, KNOWN_API_PATHS};

    /// The OpenAPI document lists every API path the server answers (the chat page, its
    /// files and the document itself aside), and only those.
    #[test]
    fn the_openapi_document_covers_the_known_paths() {
        let doc = infer_api::openapi::document("test");
        let documented: Vec<&String> = doc["paths"].as_object().unwrap().keys().collect();
        for path in &documented {
            let concrete = path.replace("{model}", "some/model");
            assert!(known_path(&concrete), "{path} is documented but not served");
        }
        for path in KNOWN_API_PATHS {
            assert!(
                documented.iter().any(|d| d == path),
                "{path} is served but not documented"
            );
        }
    }
}
