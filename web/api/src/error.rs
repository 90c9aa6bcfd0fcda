//! The error every preparation step returns: what OpenAI's API would answer (status, message,
//! the parameter at fault, the machine-readable code). Its own module, below everything that
//! returns it.

use infer_core::InferError;

/// A request that cannot be served, with the HTTP status OpenAI's API would answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
    /// OpenAI's machine-readable `error.code` (`model_not_found`, `context_length_exceeded`,
    /// ...), where one names the case; `null` otherwise, as OpenAI sends.
    pub code: Option<&'static str>,
}

impl RequestError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        RequestError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    pub fn param(mut self, name: &str) -> Self {
        self.param = Some(name.to_string());
        self
    }

    /// The engine names structured-output errors `structured_outputs`; the client may have
    /// used `response_format` or a `guided_*` field instead (`used`, from the prepared request).
    pub fn structured_param(mut self, used: Option<&'static str>) -> Self {
        if let (Some(used), Some("structured_outputs")) = (used, self.param.as_deref()) {
            self.message = self
                .message
                .replace("`structured_outputs`", &format!("`{used}`"));
            self.param = Some(used.to_string());
        }
        self
    }

    /// OpenAI's `error.type` for the status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            400 | 405 | 408 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 | 503 => "server_busy",
            _ => "internal_error",
        }
    }

    /// `body` plus the HTTP status as `error.status`, for hosts whose replies carry no status
    /// line (the browser engine's JavaScript reads it there).
    pub fn body_with_status(&self) -> serde_json::Value {
        let mut body = self.body();
        body["error"]["status"] = self.status.into();
        body
    }

    /// OpenAI's error body: `{"error": {message, type, param, code}}`; `code` is a string
    /// naming the case, or null.
    pub fn body(&self) -> serde_json::Value {
        let code = self.code.or(match self.status {
            401 => Some("invalid_api_key"),
            _ => None,
        });
        serde_json::json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": code,
        }})
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.param {
            Some(p) => write!(f, "{} (parameter `{p}`)", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for RequestError {}

impl From<InferError> for RequestError {
    fn from(e: InferError) -> Self {
        let param = match &e {
            InferError::InvalidParameter { name, .. } => Some(name.to_string()),
            InferError::PromptTooLong { .. } | InferError::EmptyPrompt => Some("prompt".into()),
            InferError::ChatTemplate(_) => Some("messages".into()),
            _ => None,
        };
        let code = match &e {
            InferError::PromptTooLong { .. } => Some("context_length_exceeded"),
            _ => None,
        };
        let status = match e {
            InferError::InvalidParameter { .. }
            | InferError::PromptTooLong { .. }
            | InferError::EmptyPrompt
            | InferError::ChatTemplate(_)
            | InferError::Tokenizer(_) => 400,
            _ => 500,
        };
        RequestError {
            status,
            message: e.to_string(),
            param,
            code,
        }
    }
}
