//! Embedding requests on the engine thread: those that arrive together are computed as one
//! engine call per pooling setting. Each answered request counts in the request metrics as a
//! finished one (`stop`), with its end-to-end latency and prompt length, as vLLM counts
//! pooling requests; a failed one is not counted (it is the client's 400).

use std::time::Instant;

use infer_core::{EmbedParams, Engine, Executor, InferError};
use tokio::sync::oneshot;

use crate::metrics::Metrics;

/// Inputs to embed and where their vectors go.
pub struct Embed {
    pub inputs: Vec<Vec<u32>>,
    pub params: EmbedParams,
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, InferError>>,
    /// When the request reached the engine handle.
    pub arrival: Instant,
}

impl Embed {
    fn answer(self, result: Result<Vec<Vec<f32>>, InferError>, metrics: &Metrics) {
        if result.is_ok() {
            let tokens = self.inputs.iter().map(Vec::len).sum();
            metrics.record_embedded(self.arrival.elapsed(), tokens);
        }
        let _ = self.reply.send(result);
    }
}

/// Embeds `pending`, one engine call per setting; when a batch fails, its requests run alone
/// so that one bad input fails only its own request.
pub fn run<E: Executor>(engine: &mut Engine<E>, metrics: &Metrics, mut pending: Vec<Embed>) {
    while let Some(first) = pending.first() {
        let params = first.params;
        let (group, rest): (Vec<_>, Vec<_>) = pending.into_iter().partition(|e| e.params == params);
        pending = rest;
        let inputs: Vec<Vec<u32>> = group.iter().flat_map(|e| e.inputs.clone()).collect();
        match engine.embed(&inputs, &params) {
            Ok(mut vectors) => {
                for e in group.into_iter().rev() {
                    let mine = vectors.split_off(vectors.len() - e.inputs.len());
                    e.answer(Ok(mine), metrics);
                }
            }
            Err(e) if group.len() == 1 => {
                if let Some(only) = group.into_iter().next() {
                    only.answer(Err(e), metrics);
                }
            }
            Err(_) => {
                for e in group {
                    let result = engine.embed(&e.inputs, &e.params);
                    e.answer(result, metrics);
                }
            }
        }
    }
}
