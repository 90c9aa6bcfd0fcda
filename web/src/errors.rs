//! Errors as OpenAI sends them: `{"error": {"message", "type", "param", "code"}}` with the
//! matching status. Bad input is a 4xx, never a 500 or a panic.

use std::convert::Infallible;

use infer_core::InferError;
use warp::http::StatusCode;
use warp::reject::Rejection;
use warp::reply::Reply;

use crate::api::{ErrorBody, ErrorDetail, RequestError};
use crate::engine_loop::SubmitError;

/// The methods the server answers (`Allow` on 405 and OPTIONS).
pub const ALLOWED_METHODS: &str = "GET, HEAD, POST, OPTIONS";

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
}

impl warp::reject::Reject for ApiError {}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn param(mut self, name: &str) -> Self {
        self.param = Some(name.to_string());
        self
    }

    /// The engine names structured-output errors `structured_outputs`; the client may have
    /// used `response_format` or a `guided_*` field instead.
    pub fn structured_param(self, used: Option<&'static str>) -> Self {
        let e = RequestError {
            status: self.status.as_u16(),
            message: self.message,
            param: self.param,
        }
        .structured_param(used);
        ApiError {
            status: self.status,
            message: e.message,
            param: e.param,
        }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::METHOD_NOT_ALLOWED
            | StatusCode::REQUEST_TIMEOUT => "invalid_request_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => "server_busy",
            _ => "internal_error",
        }
    }

    pub fn into_response(self) -> warp::reply::Response {
        let body = ErrorBody {
            error: ErrorDetail {
                kind: self.kind().to_string(),
                message: self.message,
                param: self.param,
                code: Some(self.status.as_u16().to_string()),
            },
        };
        let mut r = warp::reply::with_status(warp::reply::json(&body), self.status).into_response();
        let header = match self.status {
            StatusCode::UNAUTHORIZED => Some(("www-authenticate", "Bearer")),
            // Busy: the client should come back shortly.
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
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

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        ApiError {
            status: StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message: e.message,
            param: e.param,
        }
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
            SubmitError::Stopped => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        }
    }
}

/// Turns warp's rejections (bad JSON, body too large, unknown path) into OpenAI error bodies.
pub async fn recover(r: Rejection) -> Result<warp::reply::Response, Infallible> {
    let e = if let Some(e) = r.find::<ApiError>() {
        ApiError {
            status: e.status,
            message: e.message.clone(),
            param: e.param.clone(),
        }
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
