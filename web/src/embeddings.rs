//! `POST /v1/embeddings`: served by a pooling engine (`--runner pooling`); a generating
//! server answers it as vLLM does, with an error saying the model does not support it.

use std::sync::Arc;

use infer_api::embeddings::{embedding_reply, EmbeddingRequest};
use warp::reply::{Reply as _, Response};

use crate::body::Parsed;
use crate::errors::ApiError;
use crate::filters::blocking;
use crate::state::ServerState;

pub async fn handle(state: Arc<ServerState>, req: Parsed<EmbeddingRequest>) -> Response {
    match run(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(state: Arc<ServerState>, req: Parsed<EmbeddingRequest>) -> Result<Response, ApiError> {
    let Some(pooler) = state.pooling else {
        return Err(ApiError::bad_request(
            "The model does not support Embeddings API: this server generates; start one with --runner pooling (or --task embed) to embed",
        ));
    };
    let s = state.clone();
    let Parsed { value: req, slot } = req;
    let (req, prepared) = blocking(move || {
        let prepared = s.served().embedding(&req, pooler);
        drop(slot);
        (req, prepared)
    })
    .await?;
    let prepared = prepared?;
    let reply = state.reply("embd", req.request_id.as_deref());
    let prompt_tokens = prepared.inputs.iter().map(Vec::len).sum();
    let vectors = state
        .engine
        .embed(prepared.inputs, prepared.params)
        .await
        .map_err(|e| ApiError::from(e).param_if_unset("input"))?;
    let body = embedding_reply(&reply, &vectors, prompt_tokens, prepared.base64);
    Ok(warp::reply::json(&body).into_response())
}
