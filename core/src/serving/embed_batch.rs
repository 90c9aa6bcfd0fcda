//! Embedding requests on the engine thread: those that arrive together are computed as one
//! engine call per pooling setting; when a batch fails, its requests run alone so that one bad
//! input fails only its own request.

use std::time::Instant;

use tokio::sync::oneshot;

use super::EngineObserver;
use crate::{EmbedParams, Engine, Executor, InferError};

/// Inputs to embed and where their vectors go.
pub struct Embed {
    pub inputs: Vec<Vec<u32>>,
    pub params: EmbedParams,
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, InferError>>,
    /// When the request reached the engine handle.
    pub arrival: Instant,
}

impl Embed {
    fn answer(self, result: Result<Vec<Vec<f32>>, InferError>, observer: &mut dyn EngineObserver) {
        if result.is_ok() {
            let tokens = self.inputs.iter().map(Vec::len).sum();
            observer.embedded(self.arrival.elapsed(), tokens);
        }
        let _ = self.reply.send(result);
    }
}

/// Embeds `pending`, one engine call per setting.
pub(super) fn run<E: Executor>(
    engine: &mut Engine<E>,
    observer: &mut dyn EngineObserver,
    mut pending: Vec<Embed>,
) {
    while let Some(first) = pending.first() {
        let params = first.params;
        let (group, rest): (Vec<_>, Vec<_>) = pending.into_iter().partition(|e| e.params == params);
        pending = rest;
        let inputs: Vec<Vec<u32>> = group.iter().flat_map(|e| e.inputs.clone()).collect();
        match engine.embed(&inputs, &params) {
            Ok(mut vectors) => {
                for e in group.into_iter().rev() {
                    let mine = vectors.split_off(vectors.len() - e.inputs.len());
                    e.answer(Ok(mine), observer);
                }
            }
            Err(e) if group.len() == 1 => {
                if let Some(only) = group.into_iter().next() {
                    only.answer(Err(e), observer);
                }
            }
            Err(_) => {
                for e in group {
                    let result = engine.embed(&e.inputs, &e.params);
                    e.answer(result, observer);
                }
            }
        }
    }
}
