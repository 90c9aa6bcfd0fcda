//! The server's routes for requests that arrive without a socket: the Python package's OpenAI
//! front end and its Ray Serve replicas hand each request here, so their replies (status,
//! headers, JSON and SSE bytes) are those `infer serve` sends. Dropping a reply's body mid
//! stream drops the request's engine stream, which aborts it within one step.

use std::sync::Arc;

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use tower_service::Service;
use warp::filters::BoxedFilter;
use warp::reply::Response;

use crate::state::ServerState;

/// The routes of one server state, callable in process.
#[derive(Clone)]
pub struct InProcess {
    routes: BoxedFilter<(Response,)>,
}

/// A request that could not be made (a bad method, path or header).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InProcessError(String);

/// A reply: its status line and headers now, its body chunk by chunk.
pub struct InProcessReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    body: UnsyncBoxBody<Bytes, warp::Error>,
}

impl InProcess {
    /// `api_key`: as `--api-key` (requests must bring it).
    pub fn new(state: Arc<ServerState>, api_key: Option<String>) -> Self {
        InProcess {
            routes: crate::routes(state, api_key),
        }
    }

    /// Runs one request through the routes.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
    ) -> Result<InProcessReply, InProcessError> {
        let mut request = hyper::Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| InProcessError(format!("invalid request: {e}")))?;
        let mut service = warp::service(self.routes.clone());
        let reply = match service.call(request).await {
            Ok(reply) => reply,
            Err(never) => match never {},
        };
        let (parts, body) = reply.into_parts();
        let headers = parts
            .headers
            .iter()
            .filter_map(|(k, v)| Some((k.to_string(), v.to_str().ok()?.to_string())))
            .collect();
        Ok(InProcessReply {
            status: parts.status.as_u16(),
            headers,
            body: body.boxed_unsync(),
        })
    }
}

impl InProcessReply {
    /// The body's next chunk (`None` at its end). An SSE reply yields its events as the
    /// engine makes them.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, InProcessError>> {
        loop {
            match self.body.frame().await? {
                Ok(frame) => match frame.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => return Some(Ok(data)),
                    // Trailers: none of our replies send them.
                    Err(_) => continue,
                },
                Err(e) => return Some(Err(InProcessError(format!("reply body: {e}")))),
            }
        }
    }
}
