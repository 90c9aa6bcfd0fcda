//! The chat page at `/`: its own files embedded at compile time, and the libraries it renders
//! replies with (marked for markdown, DOMPurify to sanitise the HTML marked makes), embedded
//! by `web/build.rs` from `web/chat-page/node_modules` when `npm ci` has run there. Without
//! them `/static/vendor/*` is a 404 and the page shows replies as plain text.

use warp::reply::{Reply, Response};
use warp::Filter;

use crate::filters::get;

include!(concat!(env!("OUT_DIR"), "/chat_vendor.rs"));

fn file(body: &'static [u8], kind: &'static str) -> Response {
    warp::reply::with_header(body, "content-type", kind).into_response()
}

fn vendor(name: String) -> Response {
    match CHAT_VENDOR.iter().find(|(n, _)| *n == name) {
        Some((_, bytes)) => file(bytes, "text/javascript; charset=utf-8"),
        None => warp::reply::with_status(
            "not built into this server: run `npm ci --prefix web/chat-page`, then rebuild infer",
            warp::http::StatusCode::NOT_FOUND,
        )
        .into_response(),
    }
}

pub fn routes() -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    let page = |body: &'static str, kind: &'static str| move || file(body.as_bytes(), kind);
    let index = warp::path::end().and(get()).map(page(
        include_str!("../static/index.html"),
        "text/html; charset=utf-8",
    ));
    let script = warp::path!("static" / "chat.js").and(get()).map(page(
        include_str!("../static/chat.js"),
        "text/javascript; charset=utf-8",
    ));
    let style = warp::path!("static" / "style.css").and(get()).map(page(
        include_str!("../static/style.css"),
        "text/css; charset=utf-8",
    ));
    let libs = warp::path!("static" / "vendor" / String)
        .and(get())
        .map(vendor);
    index.or(script).unify().or(style).unify().or(libs).unify()
}
