//! The one error type of the core crate. Every variant names what went wrong and where
//! (file, tensor, limit), because these messages reach users verbatim.

use std::path::PathBuf;

pub type Result<T, E = InferError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum InferError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("model not found: `{0}` is neither a local file or directory nor a Hugging Face hub id (org/name)")]
    ModelNotFound(String),
    #[error("{path}: not a usable model directory: {reason}")]
    ModelDir { path: PathBuf, reason: String },
    #[error("{path}: invalid GGUF file: {reason}")]
    Gguf { path: PathBuf, reason: String },
    #[error("{path}: invalid safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error("{path}: invalid JSON: {reason}")]
    Json { path: PathBuf, reason: String },
    /// `why` says what kind of model it is, when we know (a mixture of experts, …).
    #[error("unsupported architecture `{name}`{why} (supported: {supported})")]
    UnsupportedArchitecture {
        name: String,
        why: String,
        supported: String,
    },
    #[error("tensor `{name}`: unsupported data type {dtype} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q2_K-Q6_K)")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("tensor `{name}` is missing from {source_name}")]
    MissingTensor { name: String, source_name: String },
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt_tokens} tokens but the model's context holds {max_model_len}")]
    PromptTooLong {
        prompt_tokens: usize,
        max_model_len: usize,
    },
    #[error("invalid parameter `{name}`: {reason}")]
    InvalidParameter { name: &'static str, reason: String },
    #[error("Hugging Face hub: {0}")]
    Hub(String),
    #[error("KV cache: {0}")]
    KvCache(String),
    #[error("{backend} backend unavailable: {reason}")]
    BackendUnavailable {
        backend: &'static str,
        reason: String,
    },
    /// Tensor parallelism: a layout that does not divide, a rank that is gone, a collective
    /// that did not complete.
    #[error("tensor parallel: {0}")]
    Distributed(String),
    #[error("{backend} backend: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },
}

impl InferError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        InferError::Io {
            path: path.into(),
            source,
        }
    }

    pub fn invalid(name: &'static str, reason: impl Into<String>) -> Self {
        InferError::InvalidParameter {
            name,
            reason: reason.into(),
        }
    }
}
