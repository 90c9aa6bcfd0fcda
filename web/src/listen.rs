//! The accept loop around warp's service: HTTP/1 connections with a header read timeout
//! (which also closes idle keep-alive connections), a cap on open connections, and a
//! shutdown that stops accepting, gives in-flight requests a bounded grace period, then
//! aborts them (streams end with an error event and `[DONE]`) and returns. With TLS, each
//! connection's handshake runs on its own task under the header timeout, so a slow or silent
//! client holds only its own connection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use warp::filters::BoxedFilter;
use warp::reply::Response;

use crate::state::ServerState;

/// Connection limits, shutdown timing and the HTTP layer's options.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// A request's headers must arrive within this; an idle keep-alive connection is closed
    /// after it too.
    pub header_read_timeout: Duration,
    /// Open connections at most (further ones wait in the kernel's backlog).
    pub max_connections: usize,
    /// After a shutdown signal, in-flight requests get this long before they are aborted.
    pub shutdown_grace: Duration,
    /// The listen backlog: connections the kernel completes before they are accepted. A burst
    /// beyond it has its SYNs dropped and retried a second later, so it is set well above
    /// the usual 1024 (the kernel lowers it to `net.core.somaxconn`).
    pub listen_backlog: u32,
    /// Root path, access log, request-id headers.
    pub http: crate::http_log::HttpOptions,
    /// HTTPS (rustls) when set; plain HTTP otherwise.
    pub tls: Option<Arc<crate::tls::Tls>>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 4096,
            shutdown_grace: Duration::from_secs(5),
            listen_backlog: 4096,
            http: crate::http_log::HttpOptions::default(),
            tls: None,
        }
    }
}

/// Raises this process's open-file limit to its hard limit (each connection holds a
/// descriptor; the usual soft default of 1024 is far too low for a server) and returns the
/// limit now in force, where the platform tells it.
pub fn raise_open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` through a pointer to a live, owned value.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: setrlimit reads one `rlimit` through a pointer to a live value.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                limit = raised;
            }
        }
        // `rlim_t` is not `u64` on every platform.
        #[allow(clippy::unnecessary_cast)]
        Some(limit.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    None
}

/// `wanted`, lowered so that connections leave room under the open-file limit for the
/// model, logs and the engine (a quarter of the limit, at least 64 descriptors).
fn connection_cap(wanted: usize) -> usize {
    let Some(limit) = raise_open_file_limit() else {
        return wanted;
    };
    let room = usize::try_from(limit.saturating_sub((limit / 4).max(64))).unwrap_or(usize::MAX);
    if room < wanted {
        tracing::warn!(
            wanted,
            capped = room,
            open_file_limit = limit,
            "--max-connections lowered to fit the open-file limit (raise `ulimit -n` for more)"
        );
    }
    wanted.min(room).max(1)
}

/// Serves one connection (plain or after its TLS handshake) as HTTP/1 until it ends or the
/// shutdown ends it; its slot under the connection cap is released after.
async fn serve_connection<IO, S>(
    io: IO,
    header_read_timeout: Duration,
    service: S,
    watcher: hyper_util::server::graceful::Watcher,
    permit: tokio::sync::OwnedSemaphorePermit,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming> + Send,
    S::Future: Send + 'static,
    S::ResBody: Send + 'static,
    <S::ResBody as hyper::body::Body>::Data: Send,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .serve_connection(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "connection ended");
    }
    drop(permit);
}

/// Serves `app` on `listener` until `shutdown` resolves, then shuts down as described above.
pub async fn serve(
    listener: TcpListener,
    app: BoxedFilter<(Response,)>,
    state: Arc<ServerState>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let service = warp::service(app);
    let layer = crate::http_log::HttpLayer::new(options.http.clone());
    let graceful = GracefulShutdown::new();
    let cap = connection_cap(options.max_connections);
    let permits = Arc::new(Semaphore::new(cap));
    let mut warned_full = false;
    let refresh = options.tls.as_ref().and_then(|tls| tls.spawn_refresh());
    tokio::pin!(shutdown);
    loop {
        if permits.available_permits() == 0 && !warned_full {
            tracing::warn!(
                max_connections = cap,
                "connection cap reached: new connections wait"
            );
        }
        warned_full = permits.available_permits() == 0;
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors and the like: back off rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = {
            let (service, layer) = (service.clone(), layer.clone());
            hyper::service::service_fn(move |req| layer.clone().call(service.clone(), req))
        };
        let watcher = graceful.watcher();
        let timeout = options.header_read_timeout;
        match &options.tls {
            None => {
                tokio::spawn(serve_connection(stream, timeout, service, watcher, permit));
            }
            Some(tls) => {
                let acceptor = tls.acceptor();
                tokio::spawn(async move {
                    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            serve_connection(stream, timeout, service, watcher, permit).await
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                });
            }
        }
    }
    drop(listener);
    if let Some(task) = refresh {
        task.abort();
    }
    tracing::info!(grace = ?options.shutdown_grace, "no longer accepting; waiting for in-flight requests");
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    if tokio::time::timeout(options.shutdown_grace, &mut drained)
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace period over: aborting what is in flight");
        // Streams get the abort as an error event, then `[DONE]`; give them a moment to go out.
        let engine = state.engine.clone();
        let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut drained).await;
    }
}
