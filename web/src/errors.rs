//! Errors as OpenAI sends them: `{"error": {"message", "type", "param", "code"}}` with the
//! matching status. Bad input is a 4xx, never a 500 or a panic.

use std::convert::Infallible;

use infer_core::InferError;
use warp::http::StatusCode;
use warp::reject::Rejection;
use warp::reply::Reply;

use crate::api::RequestError;
use crate::engine_loop::SubmitError;

/// The methods the server answers (`Allow` on 405 and OPTIONS).
pub const ALLOWED_METHODS: &str = "GET, HEAD, POST, OPTIONS";

/// An error reply: OpenAI's body (`RequestError::body`, one serializer for the server and the
/// browser engine) with its status and headers.
#[derive(Debug)]
pub struct ApiError(pub RequestError);

impl warp::reject::Reject for ApiError {}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError(RequestError::new(status.as_u16(), message))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn param(mut self, name: &str) -> Self {
        self.0.param = Some(name.to_string());
        self
    }

    /// Names `name` as the field at fault unless the error already names one.
    pub fn param_if_unset(mut self, name: &str) -> Self {
        if self.0.param.is_none() && self.0.status == 400 {
            self.0.param = Some(name.to_string());
        }
        self
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.0.code = Some(code);
        self
    }

    /// The engine names structured-output errors `structured_outputs`; the client may have
    /// used `response_format` or a `guided_*` field instead.
    pub fn structured_param(self, used: Option<&'static str>) -> Self {
        ApiError(self.0.structured_param(used))
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub fn into_response(self) -> warp::reply::Response {
        let status = self.status();
        let mut r =
            warp::reply::with_status(warp::reply::json(&self.0.body()), status).into_response();
        let header = match status {
            StatusCode::UNAUTHORIZED => Some(("www-authenticate", "Bearer")),
            // Busy: the condition passes, the client should come back shortly. (A server
            // shutting down answers 503 without it: this one will not be back.)
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
                if self.0.code != Some(SHUTTING_DOWN) =>
            {
                Some(("retry-after", "1"))
            }
            StatusCode::METHOD_NOT_ALLOWED => Some(("allow", ALLOWED_METHODS)),
            _ => None,
        };
        if let Some((name, value)) = header {
            r.headers_mut()
                .insert(name, warp::http::HeaderValue::from_static(value));
        }
        r
    }
}

/// `error.code` of requests the server's shutdown cut off or turned away.
pub const SHUTTING_DOWN: &str = "server_shutting_down";

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        ApiError(e)
    }
}

impl From<InferError> for ApiError {
    fn from(e: InferError) -> Self {
        RequestError::from(e).into()
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Invalid(e) => e.into(),
            busy @ SubmitError::Busy { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, busy.to_string())
            }
            too_many @ SubmitError::TooManyPrompts { .. } => {
                ApiError::bad_request(too_many.to_string()).param("prompt")
            }
            SubmitError::Stopped => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()).code(SHUTTING_DOWN)
            }
        }
    }
}

/// Turns warp's rejections (bad JSON, body too large, unknown path) into OpenAI error bodies.
pub async fn recover(r: Rejection) -> Result<warp::reply::Response, Infallible> {
    let e = if let Some(e) = r.find::<ApiError>() {
        ApiError(e.0.clone())
    } else if let Some(e) = r.find::<warp::filters::body::BodyDeserializeError>() {
        ApiError::bad_request(format!("invalid JSON body: {e}"))
    } else if r.find::<warp::reject::PayloadTooLarge>().is_some() {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is too large",
        )
    } else if r.find::<warp::reject::UnsupportedMediaType>().is_some() {
        ApiError::bad_request("send the body as application/json")
    } else if let Some(e) = r.find::<warp::cors::CorsForbidden>() {
        ApiError::new(StatusCode::FORBIDDEN, format!("CORS: {e}"))
    } else if r.find::<warp::reject::MethodNotAllowed>().is_some() {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
    } else if r.is_not_found() {
        ApiError::new(StatusCode::NOT_FOUND, "no such endpoint")
    } else {
        ApiError::bad_request(format!("bad request: {r:?}"))
    };
    Ok(e.into_response())
}
