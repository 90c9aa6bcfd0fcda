//! Why a sequence ended: shared by the engine's request state, its step outputs and the API
//! layers that name it (`finish_reason`).

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token was sampled.
    Stop,
    /// `max_tokens` or the context limit was reached.
    Length,
}

impl FinishReason {
    /// The API's name for it (`stop`, `length`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
