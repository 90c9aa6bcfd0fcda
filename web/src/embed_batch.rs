//! Embedding requests on the engine thread: those that arrive together are computed as one
//! engine call per pooling setting.

use infer_core::{EmbedParams, Engine, Executor, InferError};
use tokio::sync::oneshot;

/// Inputs to embed and where their vectors go.
pub struct Embed {
    pub inputs: Vec<Vec<u32>>,
    pub params: EmbedParams,
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, InferError>>,
}

/// Embeds `pending`, one engine call per setting; when a batch fails, its requests run alone
/// so that one bad input fails only its own request.
pub fn run<E: Executor>(engine: &mut Engine<E>, mut pending: Vec<Embed>) {
    while let Some(first) = pending.first() {
        let params = first.params;
        let (group, rest): (Vec<_>, Vec<_>) = pending.into_iter().partition(|e| e.params == params);
        pending = rest;
        let inputs: Vec<Vec<u32>> = group.iter().flat_map(|e| e.inputs.clone()).collect();
        match engine.embed(&inputs, &params) {
            Ok(mut vectors) => {
                for e in group.into_iter().rev() {
                    let mine = vectors.split_off(vectors.len() - e.inputs.len());
                    let _ = e.reply.send(Ok(mine));
                }
            }
            Err(e) if group.len() == 1 => {
                if let Some(only) = group.into_iter().next() {
                    let _ = only.reply.send(Err(e));
                }
            }
            Err(_) => {
                for e in group {
                    let result = engine.embed(&e.inputs, &e.params);
                    let _ = e.reply.send(result);
                }
            }
        }
    }
}
