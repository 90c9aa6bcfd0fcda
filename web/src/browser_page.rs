//! The browser demo at `/browser/`: the wasm engine's files, embedded at build time when
//! `scripts/build-browser.sh` has run, and the GGUF this server loaded at
//! `/browser/model.gguf` (with HTTP Range support), which the page loads by default.

use std::sync::Arc;

use warp::reply::{Reply, Response};
use warp::Filter;

use crate::filters::{get, Auth};
use crate::state::ServerState;

include!(concat!(env!("OUT_DIR"), "/browser_assets.rs"));

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("wasm") => "application/wasm",
        _ => "application/octet-stream",
    }
}

const NOT_BUILT: &str = "<!doctype html><title>infer: browser build missing</title>\
<p>This server was built without the browser engine. Run <code>scripts/build-browser.sh</code>, \
then rebuild <code>infer</code>; or serve the folder it writes from any static host.</p>";

fn asset(tail: &str) -> Response {
    let path = if tail.is_empty() { "index.html" } else { tail };
    match BROWSER_ASSETS.iter().find(|(p, _)| *p == path) {
        Some((p, bytes)) => {
            warp::reply::with_header(*bytes, "content-type", content_type(p)).into_response()
        }
        None if BROWSER_ASSETS.is_empty() => warp::reply::with_status(
            warp::reply::html(NOT_BUILT),
            warp::http::StatusCode::NOT_FOUND,
        )
        .into_response(),
        None => {
            warp::reply::with_status("not found", warp::http::StatusCode::NOT_FOUND).into_response()
        }
    }
}

pub fn routes(
    state: Arc<ServerState>,
    auth: Auth,
) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // warp's file filter answers Range requests (the page reads tensors in ranges when the
    // browser's cache is off or full); an empty path is a 404 when the model is no GGUF file.
    // The weights are behind the key when the server has one (the page sends it when given).
    let model = warp::path!("browser" / "model.gguf")
        .and(auth)
        .and(warp::fs::file(state.model_file.clone().unwrap_or_default()))
        .map(|f: warp::fs::File| f.into_response());
    // warp matches `/browser` and `/browser/` alike: only the first is sent to the second,
    // so the page's relative URLs (`infer.js`, `model.gguf`) resolve under `/browser/`.
    let files = warp::path("browser")
        .and(warp::path::full())
        .and(warp::path::tail())
        .and(get())
        // The weights are the route above's alone: its 401 must not become this one's 404.
        .and_then(
            |full: warp::path::FullPath, tail: warp::path::Tail| async move {
                if tail.as_str() == "model.gguf" {
                    Err(warp::reject::not_found())
                } else {
                    Ok((full, tail))
                }
            },
        )
        .untuple_one()
        .map(|full: warp::path::FullPath, tail: warp::path::Tail| {
            if tail.as_str().is_empty() && !full.as_str().ends_with('/') {
                warp::redirect::see_other(warp::http::Uri::from_static("/browser/")).into_response()
            } else {
                asset(tail.as_str())
            }
        });
    model.or(files).unify()
}
