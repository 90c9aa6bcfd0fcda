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
    /// A backend op (or the engine's check of what a backend returned) failed.
    #[error("{backend} backend: {source}")]
    Backend {
        backend: String,
        source: BackendError,
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

/// Why a backend op failed, with the op and the numbers involved, so a caller (or a test) can
/// tell a caller's bug (operands that do not fit, an index out of range) from a limit of the
/// device and from the device failing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// Operands whose shapes do not fit the op; `expected` states the rule they break.
    #[error("{op}: {} do not fit: {expected}", Operand::list(.operands))]
    Shape {
        op: &'static str,
        operands: Vec<Operand>,
        expected: String,
    },
    /// An index (token id, slot, block, layer, position, row) outside what it indexes.
    #[error("{op}: {what} {index} outside 0..{len}")]
    OutOfRange {
        op: &'static str,
        what: &'static str,
        index: u64,
        len: u64,
    },
    /// A count that differs from the one the op needs (outputs, rows, probabilities).
    #[error("{op}: {got} {what}, expected {expected}")]
    Count {
        op: &'static str,
        what: &'static str,
        got: usize,
        expected: usize,
    },
    /// A size past what the device or a kernel's argument type holds.
    #[error("{op}: {what} of {value} exceeds the limit of {limit}")]
    TooLarge {
        op: &'static str,
        what: &'static str,
        value: u64,
        limit: u64,
    },
    /// A layout or data type this backend does not implement for the op.
    #[error("{op}: unsupported: {what}")]
    Unsupported { op: &'static str, what: String },
    /// The device, its driver or runtime failed; `message` is theirs.
    #[error("{op}: {message}")]
    Device { op: &'static str, message: String },
}

/// One operand of a failed op: its name in the op's signature and its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    pub name: &'static str,
    pub shape: Vec<usize>,
}

impl Operand {
    fn list(operands: &[Operand]) -> String {
        let each: Vec<String> = operands
            .iter()
            .map(|o| format!("{} {:?}", o.name, o.shape))
            .collect();
        each.join(", ")
    }
}

impl BackendError {
    pub fn shape(
        op: &'static str,
        operands: &[(&'static str, &[usize])],
        expected: impl Into<String>,
    ) -> Self {
        BackendError::Shape {
            op,
            operands: operands
                .iter()
                .map(|&(name, shape)| Operand {
                    name,
                    shape: shape.to_vec(),
                })
                .collect(),
            expected: expected.into(),
        }
    }

    pub fn out_of_range(
        op: &'static str,
        what: &'static str,
        index: impl Into<u64>,
        len: usize,
    ) -> Self {
        BackendError::OutOfRange {
            op,
            what,
            index: index.into(),
            len: len as u64,
        }
    }

    pub fn count(op: &'static str, what: &'static str, got: usize, expected: usize) -> Self {
        BackendError::Count {
            op,
            what,
            got,
            expected,
        }
    }

    pub fn too_large(op: &'static str, what: &'static str, value: u64, limit: u64) -> Self {
        BackendError::TooLarge {
            op,
            what,
            value,
            limit,
        }
    }

    pub fn unsupported(op: &'static str, what: impl Into<String>) -> Self {
        BackendError::Unsupported {
            op,
            what: what.into(),
        }
    }

    pub fn device(op: &'static str, message: impl std::fmt::Display) -> Self {
        BackendError::Device {
            op,
            message: message.to_string(),
        }
    }

    /// The first of `indices` at or past `len`, as an error (token ids against the vocabulary,
    /// slots against the cache, ...): backends check what the engine hands them before a
    /// kernel reads memory with it.
    pub fn check_indices<'a>(
        op: &'static str,
        what: &'static str,
        indices: impl IntoIterator<Item = &'a u32>,
        len: usize,
    ) -> std::result::Result<(), Self> {
        match indices.into_iter().find(|&&i| i as usize >= len) {
            Some(&i) => Err(Self::out_of_range(op, what, i, len)),
            None => Ok(()),
        }
    }

    /// Element-wise ops: both operands have the same shape.
    pub fn check_same_shape(
        op: &'static str,
        a: (&'static str, &[usize]),
        b: (&'static str, &[usize]),
    ) -> std::result::Result<(), Self> {
        if a.1 == b.1 {
            Ok(())
        } else {
            Err(Self::shape(op, &[a, b], "equal shapes"))
        }
    }

    /// The error as the engine reports it, naming the backend it came from.
    pub fn on(self, backend: impl Into<String>) -> InferError {
        InferError::Backend {
            backend: backend.into(),
            source: self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_name_the_backend_op_operands_and_rule() {
        let e = BackendError::shape(
            "matmul",
            &[("x", &[2, 8]), ("w", &[3, 6])],
            "x [m, k] · w [n, k]ᵀ",
        );
        assert_eq!(
            e.clone().on("cpu").to_string(),
            "cpu backend: matmul: x [2, 8], w [3, 6] do not fit: x [m, k] · w [n, k]ᵀ"
        );
        let e = BackendError::check_indices("embedding", "token id", &[1, 7, 9], 5).unwrap_err();
        assert_eq!(e.to_string(), "embedding: token id 7 outside 0..5");
        assert!(BackendError::check_indices("embedding", "token id", &[1, 4], 5).is_ok());
        let source = std::error::Error::source(&e.clone().on("wgpu")).map(ToString::to_string);
        assert_eq!(source, Some(e.to_string()));
    }
}
