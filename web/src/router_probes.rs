//! What routers in front of replicas probe besides `/health` and `/metrics`: SGLang's worker
//! endpoints, which sglang-router (sgl-model-gateway) reads when a worker registers
//! (`/server_info`, `/model_info`, older releases `/get_server_info`, `/get_model_info`) and
//! for load-aware policies (`/get_load`). The shapes follow SGLang's `http_server.py`; only
//! fields infer can fill truthfully are sent. The Kubernetes Gateway API inference extension
//! reads `/metrics` instead (`--metrics-prefix vllm`: `vllm:num_requests_waiting`,
//! `vllm:kv_cache_usage_perc`).

use std::sync::Arc;

use serde_json::json;
use warp::filters::BoxedFilter;
use warp::reply::Response;
use warp::{Filter, Reply};

use crate::filters::{get, with_state, Auth};
use crate::state::ServerState;

/// `/get_load` stays open (routers poll it without a key); the model and server details are
/// behind the key when the server has one: they name the model and hold its chat template.
pub fn routes(state: Arc<ServerState>, auth: Auth) -> BoxedFilter<(Response,)> {
    let model_info = warp::path("get_model_info")
        .or(warp::path("model_info"))
        .unify()
        .and(warp::path::end())
        .and(get())
        .and(auth.clone())
        .and(with_state(state.clone()))
        .map(|s: Arc<ServerState>| {
            warp::reply::json(&json!({
                "model_path": s.model_name,
                "tokenizer_path": s.model_name,
                "served_model_name": s.model_name,
                "is_generation": true,
                "preferred_sampling_params": null,
                "weight_version": "default",
                "has_image_understanding": false,
                "has_audio_understanding": false,
            }))
            .into_response()
        });
    let server_info = warp::path("get_server_info")
        .or(warp::path("server_info"))
        .unify()
        .and(warp::path::end())
        .and(get())
        .and(auth)
        .and(with_state(state.clone()))
        .then(|s: Arc<ServerState>| async move {
            let stats = s.engine.stats().await.unwrap_or_default();
            warp::reply::json(&json!({
                "model_path": s.model_name,
                "tokenizer_path": s.model_name,
                "served_model_name": s.model_name,
                "context_length": s.max_model_len,
                "max_req_input_len": s.max_model_len,
                // One engine (tensor-parallel ranks included) per server: no data parallelism.
                "dp_size": 1,
                "backend": s.backend,
                "version": env!("CARGO_PKG_VERSION"),
                "chat_template": s.tokenizer.chat_template(),
                "internal_states": [{
                    "num_running_reqs": stats.num_running,
                    "num_waiting_reqs": stats.num_waiting,
                    "kv_cache_usage": stats.kv_usage,
                }],
            }))
            .into_response()
        });
    let load = warp::path!("get_load")
        .and(get())
        .and(with_state(state))
        .then(|s: Arc<ServerState>| async move {
            let stats = s.engine.stats().await.unwrap_or_default();
            warp::reply::json(&json!([{
                "dp_rank": 0,
                "num_reqs": stats.num_running + stats.num_waiting + stats.num_swapped,
                "num_waiting_reqs": stats.num_waiting,
                "kv_cache_usage": stats.kv_usage,
            }]))
            .into_response()
        });
    model_info.or(server_info).unify().or(load).unify().boxed()
}
