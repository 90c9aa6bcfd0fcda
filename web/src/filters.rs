//! The warp filters and helpers that the routes and their handlers share: the state, GET
//! (and HEAD), the API key, and the blocking pool for tokenizer work. Below `routes` and every
//! handler module, so none of them needs the other to reach these.

use std::convert::Infallible;
use std::sync::Arc;

use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use crate::errors::ApiError;
use crate::state::ServerState;

pub(crate) fn with_state(
    state: Arc<ServerState>,
) -> impl Filter<Extract = (Arc<ServerState>,), Error = Infallible> + Clone {
    warp::any().map(move || state.clone())
}

/// GET, and HEAD answered alike (hyper sends no body for HEAD).
pub(crate) fn get() -> impl Filter<Extract = (), Error = warp::Rejection> + Clone {
    warp::get().or(warp::head()).unify()
}

/// Runs tokenizer work (rendering, encoding, decoding) on the blocking pool, off the
/// runtime's few worker threads, so a huge prompt never stalls other requests.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("a tokenizer task failed: {e}"),
        )
    })
}

/// The filter that lets a request through when it carries the server's key (every request
/// when there is none).
pub(crate) type Auth = BoxedFilter<()>;

/// Whether an `Authorization` header carries `key`: the `Bearer` scheme in any case (RFC 9110
/// makes schemes case-insensitive), the token compared in constant time, so response timing
/// does not leak how much of a guess was right.
pub(crate) fn key_matches(header: Option<&str>, key: &str) -> bool {
    use subtle::ConstantTimeEq;
    let Some((scheme, token)) = header.map(str::trim).and_then(|h| h.split_once(' ')) else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer")
        && bool::from(token.trim().as_bytes().ct_eq(key.as_bytes()))
}

/// `Authorization: Bearer KEY` when the server has a key.
pub(crate) fn auth(key: Option<String>) -> Auth {
    warp::header::optional::<String>("authorization")
        .and_then(move |header: Option<String>| {
            let key = key.clone();
            async move {
                match key {
                    None => Ok(()),
                    Some(k) if key_matches(header.as_deref(), &k) => Ok(()),
                    Some(_) => Err(warp::reject::custom(ApiError::new(
                        StatusCode::UNAUTHORIZED,
                        "missing or wrong API key (send `Authorization: Bearer KEY`)",
                    ))),
                }
            }
        })
        .untuple_one()
        .boxed()
}
