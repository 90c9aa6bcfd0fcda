//! Request bodies: JSON read as a stream, with or without `Content-Length` (chunked bodies
//! too), refused past `MAX_BODY_BYTES` as soon as they pass it, and given up on when the
//! client stops sending for the whole read timeout (a slow client cannot hold a handler).
//! Large bodies are charged to the server's byte budget as they arrive; a body is parsed on
//! the blocking pool once it holds a preparation slot, which the handler keeps while it
//! renders and tokenizes (`budget`).

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use warp::http::StatusCode;
use warp::{Buf, Filter, Rejection};

use crate::budget::{BodyCharge, Budget, Preparing};
use crate::errors::ApiError;
use std::sync::Arc;

/// Request bodies above this are refused with 413.
pub const MAX_BODY_BYTES: u64 = 8 << 20;

/// The longest a body may take to arrive, from its first byte wait to its last.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

async fn collect(
    mut body: impl Stream<Item = Result<impl Buf, warp::Error>> + Unpin,
    budget: &Budget,
    charge: &mut BodyCharge,
) -> Result<Vec<u8>, ApiError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = body.next().await {
        let mut chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        if bytes.len() as u64 + chunk.remaining() as u64 > MAX_BODY_BYTES {
            return Err(too_large());
        }
        budget.charge_body(charge, bytes.len() + chunk.remaining())?;
        while chunk.has_remaining() {
            let part = chunk.chunk();
            bytes.extend_from_slice(part);
            let n = part.len();
            chunk.advance(n);
        }
    }
    Ok(bytes)
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the request body is larger than {} MiB",
            MAX_BODY_BYTES >> 20
        ),
    )
}

/// A parsed body, with the preparation slot its handler holds while it renders and tokenizes.
pub struct Parsed<T> {
    pub value: T,
    pub slot: Preparing,
}

/// A JSON body of type `T`, parsed on the blocking pool within a preparation slot.
pub fn json<T: serde::de::DeserializeOwned + Send + 'static>(
    budget: Arc<Budget>,
) -> impl Filter<Extract = (Parsed<T>,), Error = Rejection> + Clone {
    warp::header::optional::<u64>("content-length")
        .and(warp::header::optional::<String>("content-type"))
        .and(warp::body::stream())
        .and_then(move |length: Option<u64>, kind: Option<String>, body| {
            let budget = budget.clone();
            async move {
                if length.is_some_and(|l| l > MAX_BODY_BYTES) {
                    return Err(warp::reject::custom(too_large()));
                }
                if kind.is_some_and(|k| !k.to_ascii_lowercase().contains("json")) {
                    return Err(warp::reject::custom(ApiError::bad_request(
                        "send the body as application/json",
                    )));
                }
                let mut charge = BodyCharge::none();
                let read = collect(Box::pin(body), &budget, &mut charge);
                let bytes = match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
                    Ok(read) => read.map_err(warp::reject::custom)?,
                    Err(_) => {
                        return Err(warp::reject::custom(ApiError::new(
                            StatusCode::REQUEST_TIMEOUT,
                            format!(
                                "the body did not arrive within {} s",
                                BODY_READ_TIMEOUT.as_secs()
                            ),
                        )))
                    }
                };
                let big = bytes.len() > crate::budget::CHARGED_BODY_BYTES;
                let slot = budget.preparing(big).await.map_err(warp::reject::custom)?;
                // Parsing a large body takes tens of milliseconds: off the async workers.
                let parsed = tokio::task::spawn_blocking(move || {
                    let parsed = infer_api::fields::parse_body::<T>(&bytes);
                    drop((bytes, charge));
                    parsed
                })
                .await
                .map_err(|e| {
                    warp::reject::custom(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("parsing the body failed: {e}"),
                    ))
                })?;
                let value = parsed.map_err(|e| warp::reject::custom(ApiError(e)))?;
                Ok(Parsed { value, slot })
            }
        })
}
