//! Waiting for a request's last output (the non-streamed replies of every route), with the
//! engine's failures as API errors.

use infer_core::{CompletionOutput, TokenLogprobs};

use crate::engine_loop::{Event, Events};
use crate::errors::ApiError;

/// A request's last output.
pub struct Finished {
    pub outputs: Vec<CompletionOutput>,
    pub prompt_len: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached: usize,
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
}

/// Waits for a request's last output.
pub async fn finish(mut events: Events) -> Result<Finished, ApiError> {
    while let Some(ev) = events.recv().await {
        match ev {
            Event::Output(out) => {
                if let Some(outputs) = out.outputs {
                    return Ok(Finished {
                        outputs,
                        prompt_len: out.metrics.num_prompt_tokens,
                        cached: out.metrics.num_cached_tokens.unwrap_or(0),
                        prompt_logprobs: out.prompt_logprobs,
                    });
                }
            }
            // Cut off by shutdown: 503, which clients retry (elsewhere); an engine failure: 500.
            Event::Failed {
                message,
                shutdown: true,
            } => {
                return Err(
                    ApiError::new(warp::http::StatusCode::SERVICE_UNAVAILABLE, message)
                        .code(crate::errors::SHUTTING_DOWN),
                )
            }
            Event::Failed { message, .. } => {
                return Err(ApiError::new(
                    warp::http::StatusCode::INTERNAL_SERVER_ERROR,
                    message,
                ))
            }
        }
    }
    Err(ApiError::new(
        warp::http::StatusCode::INTERNAL_SERVER_ERROR,
        "the request ended without output",
    ))
}
