//! infer's OpenAI-compatible HTTP server on warp: the engine runs on its own thread
//! (`engine_loop`), handlers talk to it over channels and stream with SSE.

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]

pub use infer_api as api;
mod body;
mod browser_page;
pub mod budget;
mod chat;
mod chat_page;
mod completions;
pub mod cors;
mod embeddings;
pub mod engine_loop;
pub mod errors;
mod filters;
mod finished;
mod http_log;
mod in_process;
mod listen;
pub mod metrics;
mod responses;
mod router_probes;
mod routes;
mod sse;
mod state;
mod stats_log;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

pub use body::MAX_BODY_BYTES;
pub use cors::CorsConfig;
pub use engine_loop::{start_engine, AsyncEngine, LoopOptions, SubmitError};
pub use http_log::HttpOptions;
pub use in_process::{InProcess, InProcessError, InProcessReply};
pub use listen::{raise_open_file_limit, ServeOptions};
pub use metrics::Metrics;
pub use routes::routes;
pub use state::ServerState;
pub use tls::{ClientCerts, Tls, TlsError, TlsFiles};

/// Binds `addr` (port 0 picks a free one) and returns the bound address and the server, which
/// serves until `shutdown` resolves, then stops accepting, gives in-flight requests
/// `options.shutdown_grace`, aborts what is left and ends.
pub async fn bind_with(
    state: Arc<ServerState>,
    addr: SocketAddr,
    api_key: Option<String>,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted server can take its port back at once.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(options.listen_backlog)?;
    let local = listener.local_addr()?;
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(%local, scheme, model = %state.model_name, backend = %state.backend, "listening");
    let app = routes(state.clone(), api_key);
    Ok((local, async move {
        listen::serve(listener, app, state.clone(), options, shutdown).await;
        let engine = state.engine.clone();
        let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
    }))
}

/// `bind_with` the default timeouts and limits.
pub async fn bind(
    state: Arc<ServerState>,
    addr: SocketAddr,
    api_key: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    bind_with(state, addr, api_key, ServeOptions::default(), shutdown).await
}
