//! infer's OpenAI-compatible HTTP server on warp: the engine runs on its own thread
//! (`engine_loop`), handlers talk to it over channels and stream with SSE.

pub use infer_api as api;
mod browser_page;
mod chat;
mod completions;
pub mod engine_loop;
pub mod errors;
pub mod metrics;
mod routes;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;

pub use engine_loop::{EngineHandle, SubmitError};
pub use metrics::Metrics;
pub use routes::{routes, MAX_BODY_BYTES};
pub use state::ServerState;

/// Binds `addr` (port 0 picks a free one) and returns the bound address and the server, which
/// serves until `shutdown` resolves, then stops accepting, aborts what is in flight and ends.
pub async fn bind(
    state: Arc<ServerState>,
    addr: SocketAddr,
    api_key: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tracing::info!(%local, model = %state.model_name, backend = %state.backend, "listening");
    let server = warp::serve(routes(state.clone(), api_key))
        .incoming(listener)
        .graceful(shutdown)
        .run();
    Ok((local, async move {
        server.await;
        state.engine.shutdown();
    }))
}
