//! What happens around every request before warp's routes see it and after they answer:
//! vLLM's `--root-path` (a proxy's path prefix, taken off), the access line (method, path,
//! status, latency to the response head, request id; never the body, query or key), and
//! `X-Request-Id` on responses (`--enable-request-id-headers`).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::Request;
use tracing::Level;
use warp::http::header::HeaderValue;
use warp::http::Uri;
use warp::reply::Response;

/// The HTTP layer's options (`infer serve` flags of vLLM's names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpOptions {
    /// The access line's level (`--uvicorn-log-level`); `None`: no access log
    /// (`--disable-uvicorn-access-log`).
    pub access_log: Option<Level>,
    /// Paths with no access line (`--disable-access-log-for-endpoints`: `/health,/metrics`).
    pub access_log_skip: Vec<String>,
    /// A path prefix a proxy may leave on requests (`--root-path /api`): `/api/v1/models` is
    /// served as `/v1/models` (and `/v1/models` still is).
    pub root_path: Option<String>,
    /// Every response carries `X-Request-Id`: the request's own, or a fresh one.
    pub request_id_headers: bool,
}

const REQUEST_ID: &str = "x-request-id";

/// Takes the root path off a request's path, when it is there.
fn strip_root(uri: &Uri, root: &str) -> Option<Uri> {
    let path = uri.path();
    let rest = path.strip_prefix(root)?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    let rest = if rest.is_empty() { "/" } else { rest };
    let path_and_query = match uri.query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    };
    Uri::builder().path_and_query(path_and_query).build().ok()
}

/// The state the wrapper shares between connections.
pub struct HttpLayer {
    options: HttpOptions,
    next_id: AtomicU64,
    started: u64,
}

impl HttpLayer {
    pub fn new(options: HttpOptions) -> Arc<Self> {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let root_path = options
            .root_path
            .as_deref()
            .map(|r| r.trim_end_matches('/'))
            .filter(|r| !r.is_empty())
            .map(|r| {
                if r.starts_with('/') {
                    r.to_string()
                } else {
                    format!("/{r}")
                }
            });
        Arc::new(HttpLayer {
            options: HttpOptions {
                root_path,
                ..options
            },
            next_id: AtomicU64::new(0),
            started,
        })
    }

    /// Serves one request through `inner` (warp's service).
    pub async fn call<S>(
        self: Arc<Self>,
        mut inner: S,
        mut req: Request<Incoming>,
    ) -> Result<Response, Infallible>
    where
        S: tower_service::Service<Request<Incoming>, Response = Response, Error = Infallible>,
    {
        let start = Instant::now();
        if let Some(root) = &self.options.root_path {
            if let Some(uri) = strip_root(req.uri(), root) {
                *req.uri_mut() = uri;
            }
        }
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let given = req
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= 128)
            .map(str::to_string);
        let id = given.unwrap_or_else(|| {
            let n = self.next_id.fetch_add(1, Ordering::Relaxed);
            format!("{:x}-{n:x}", self.started)
        });
        // warp's service is always ready (`poll_ready` returns `Ready` at once).
        let mut res = inner.call(req).await?;
        if self.options.request_id_headers {
            if let Ok(v) = HeaderValue::from_str(&id) {
                res.headers_mut().insert(REQUEST_ID, v);
            }
        }
        if let Some(level) = self.options.access_log {
            if !self.options.access_log_skip.iter().any(|p| p == &path) {
                let status = res.status().as_u16();
                let ms = start.elapsed().as_secs_f64() * 1e3;
                access_line(level, method.as_str(), &path, status, ms, &id);
            }
        }
        Ok(res)
    }
}

/// One access line at `level` (tracing's macros take the level as a constant).
fn access_line(level: Level, method: &str, path: &str, status: u16, ms: f64, id: &str) {
    macro_rules! line {
        ($lvl:expr) => {
            tracing::event!(target: "infer::access", $lvl, method, path, status, latency_ms = (ms * 10.0).round() / 10.0, request_id = id, "{method} {path} {status}")
        };
    }
    match level {
        Level::ERROR => line!(Level::ERROR),
        Level::WARN => line!(Level::WARN),
        Level::INFO => line!(Level::INFO),
        Level::DEBUG => line!(Level::DEBUG),
        Level::TRACE => line!(Level::TRACE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_path_comes_off_whole_segments_only() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert_eq!(
            strip_root(&uri("/api/v1/models?x=1"), "/api").unwrap(),
            uri("/v1/models?x=1")
        );
        assert_eq!(strip_root(&uri("/api"), "/api").unwrap(), uri("/"));
        assert!(strip_root(&uri("/apix/v1"), "/api").is_none());
        assert!(strip_root(&uri("/v1/models"), "/api").is_none());
    }
}
