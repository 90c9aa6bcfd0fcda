//! `infer._infer.Engine`: a model loaded from `infer serve`'s flags, its engine running on its
//! own thread, and the server's routes in process. Requests are prepared from JSON bodies by
//! the server's code (`/v1/completions`' fields for `generate`, `/v1/chat/completions`' for
//! `chat`), so every check and message is the server's.

use std::sync::Arc;

use futures_util::future::join_all;
use infer_api::defaults::RequestDefaults;
use infer_api::fields::{apply_common, parse_body};
use infer_api::types::{ChatRequest, CompletionRequest};
use infer_core::serving::NewRequest;
use infer_core::SamplingParams;
use infer_web::{InProcess, ServerState};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::{request_error, start_error, submit_error};
use crate::stream::{block_on, Reply, Stream};
use crate::tokenizer::Tokenizer;

#[pyclass(module = "infer._infer", frozen)]
pub struct Engine {
    state: Arc<ServerState>,
    routes: InProcess,
}

/// A request ready for the engine: its prompts' token ids and sampling parameters.
#[pyclass(module = "infer._infer", frozen)]
pub struct Prepared {
    #[pyo3(get)]
    prompt_token_ids: Vec<Vec<u32>>,
    params: SamplingParams,
    structured_param: Option<&'static str>,
    /// `echo` with `max_tokens: 0`: only the prompt is scored (the generated token dropped).
    #[pyo3(get)]
    prompt_only: bool,
}

#[pymethods]
impl Prepared {
    /// Sequences returned per prompt (`n`).
    #[getter]
    fn n(&self) -> usize {
        self.params.n
    }

    /// The engine's parameters as it runs them (for logs and tests).
    fn params_repr(&self) -> String {
        format!("{:?}", self.params)
    }
}

/// Checks `/v1/completions` sampling fields (JSON, no prompt) as the server checks them,
/// raising `RequestError` with its message: `SamplingParams` validates when it is made.
#[pyfunction]
pub fn check_sampling(body_json: &str) -> PyResult<()> {
    let mut body: serde_json::Value = serde_json::from_str(body_json)
        .map_err(|e| PyValueError::new_err(format!("invalid JSON: {e}")))?;
    body["prompt"] = serde_json::json!([0]);
    let req: CompletionRequest =
        parse_body(body.to_string().as_bytes()).map_err(|e| request_error(&e))?;
    let check = || {
        let mut params =
            req.sampling
                .to_params(req.max_tokens, req.logprobs, RequestDefaults::none())?;
        params.prompt_logprobs = req.prompt_logprobs;
        apply_common(&req.extra, &req.structured, &req.sampling, &mut params)?;
        params.validate()?;
        Ok::<_, infer_api::prepare::RequestError>(())
    };
    check().map_err(|e| request_error(&e))
}

impl Engine {
    fn requests(&self, prepared: &Prepared, request_ids: Vec<String>) -> PyResult<Vec<NewRequest>> {
        if request_ids.len() != prepared.prompt_token_ids.len() {
            return Err(PyValueError::new_err(format!(
                "{} request ids for {} prompts",
                request_ids.len(),
                prepared.prompt_token_ids.len()
            )));
        }
        Ok(request_ids
            .into_iter()
            .zip(&prepared.prompt_token_ids)
            .map(|(id, prompt)| NewRequest {
                id,
                prompt: prompt.clone(),
                params: prepared.params.clone(),
            })
            .collect())
    }
}

#[pymethods]
impl Engine {
    /// Loads the model `args` name (the flags of `infer serve`, vLLM's spellings) and starts
    /// its engine.
    #[new]
    fn new(py: Python<'_>, args: Vec<String>) -> PyResult<Self> {
        let (serve, notes) =
            infer_cli::serve_args(args).map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
        if serve.model.parallel.tensor_parallel_size > 1 {
            return Err(PyValueError::new_err(
                "tensor_parallel_size > 1 is not supported from Python yet: serve the model with `infer serve --tensor-parallel-size N` and use its OpenAI API",
            ));
        }
        // The pool's threads outlive every engine of the process (engines may be stopped).
        infer_cli::model::build_pool(serve.model.threads, false)
            .map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
        for note in notes {
            tracing::info!("{note}");
        }
        let state = py
            .detach(|| infer_cli::serve::build_state(&serve))
            .map_err(|e| start_error(format!("{e:#}")))?;
        let routes = InProcess::new(state.clone(), serve.api_key.clone());
        Ok(Engine { state, routes })
    }

    /// The name requests use for the model (`--served-model-name`, else the model).
    #[getter]
    fn model_name(&self) -> &str {
        &self.state.model_name
    }

    #[getter]
    fn max_model_len(&self) -> usize {
        self.state.max_model_len
    }

    /// The backend the model runs on, in words.
    #[getter]
    fn backend(&self) -> &str {
        &self.state.backend
    }

    /// The KV pool and scheduler as built (JSON).
    fn config_json(&self) -> String {
        let c = self.state.engine.config();
        serde_json::json!({
            "block_size": c.block_size,
            "num_gpu_blocks": c.num_device_blocks,
            "num_cpu_blocks": c.num_host_blocks,
            "enable_prefix_caching": c.enable_prefix_caching,
            "max_model_len": c.max_model_len,
            "max_num_seqs": c.scheduler.max_num_seqs,
            "max_num_batched_tokens": c.scheduler.max_num_batched_tokens,
        })
        .to_string()
    }

    fn tokenizer(&self) -> Tokenizer {
        Tokenizer::new(self.state.clone())
    }

    /// A `/v1/completions` body (JSON) as engine requests, checked as the server checks it.
    fn prepare_completion(&self, py: Python<'_>, body_json: &str) -> PyResult<Prepared> {
        let req: CompletionRequest =
            parse_body(body_json.as_bytes()).map_err(|e| request_error(&e))?;
        let prepared = py
            .detach(|| self.state.served().completion(&req))
            .map_err(|e| request_error(&e))?;
        Ok(Prepared {
            prompt_token_ids: prepared.prompts,
            params: prepared.params,
            structured_param: prepared.structured_param,
            prompt_only: prepared.prompt_only,
        })
    }

    /// A `/v1/chat/completions` body (JSON) as an engine request: the messages through the
    /// chat template (with tools), checked as the server checks them.
    fn prepare_chat(&self, py: Python<'_>, body_json: &str) -> PyResult<Prepared> {
        let req: ChatRequest = parse_body(body_json.as_bytes()).map_err(|e| request_error(&e))?;
        let prepared = py
            .detach(|| self.state.served().chat(&req))
            .map_err(|e| request_error(&e))?;
        Ok(Prepared {
            prompt_token_ids: vec![prepared.prompt],
            params: prepared.params,
            structured_param: prepared.structured_param,
            prompt_only: false,
        })
    }

    /// Queues every job's prompts (a job: a prepared request and its prompts' request ids),
    /// all or none; one stream per prompt, grouped by job. The jobs' commands reach the engine
    /// thread together, so it admits them at the same step: submitting one job after another
    /// would wait a step each and stagger an offline batch (189 steps instead of 130 for 32
    /// prompts of 128 tokens).
    fn submit(
        &self,
        py: Python<'_>,
        jobs: Vec<(PyRef<'_, Prepared>, Vec<String>)>,
    ) -> PyResult<Vec<Vec<Stream>>> {
        let mut batches = Vec::with_capacity(jobs.len());
        for (prepared, request_ids) in jobs {
            let requests = self.requests(&prepared, request_ids)?;
            batches.push((requests, prepared.structured_param));
        }
        let engine = self.state.engine.clone();
        let submitted = block_on(py, async move {
            join_all(batches.into_iter().map(|(requests, structured)| {
                let engine = &engine;
                async move {
                    let ids: Vec<String> = requests.iter().map(|r| r.id.clone()).collect();
                    (ids, engine.submit_all(requests).await, structured)
                }
            }))
            .await
        });
        // On an error the admitted jobs' streams are dropped here, which aborts them.
        submitted
            .into_iter()
            .map(|(ids, result, structured)| {
                let streams = result.map_err(|e| submit_error(e, structured))?;
                Ok(ids
                    .into_iter()
                    .zip(streams)
                    .map(|(id, s)| Stream::new(id, s))
                    .collect())
            })
            .collect()
    }

    /// `submit` as an awaitable.
    fn submit_async<'py>(
        &self,
        py: Python<'py>,
        prepared: &Prepared,
        request_ids: Vec<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let requests = self.requests(prepared, request_ids)?;
        let ids: Vec<String> = requests.iter().map(|r| r.id.clone()).collect();
        let engine = self.state.engine.clone();
        let structured = prepared.structured_param;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let streams = engine
                .submit_all(requests)
                .await
                .map_err(|e| submit_error(e, structured))?;
            Ok(ids
                .into_iter()
                .zip(streams)
                .map(|(id, s)| Stream::new(id, s))
                .collect::<Vec<_>>())
        })
    }

    /// Aborts requests by id; their streams end.
    fn abort(&self, request_ids: Vec<String>) {
        self.state.engine.abort(request_ids);
    }

    /// The engine's counters (JSON); `None` once it has stopped.
    fn stats_json(&self, py: Python<'_>) -> Option<String> {
        let engine = self.state.engine.clone();
        let stats = block_on(py, async move { engine.stats().await })?;
        serde_json::to_string(&stats).ok()
    }

    /// Whether the engine thread still runs (a health check's question).
    fn is_running(&self) -> bool {
        self.state.engine.is_running()
    }

    /// One OpenAI request through `infer serve`'s routes: the reply's status, headers and
    /// body (chunk by chunk for SSE) are the server's.
    #[pyo3(signature = (method, path, body, headers = Vec::new()))]
    fn openai(
        &self,
        py: Python<'_>,
        method: &str,
        path: &str,
        body: Vec<u8>,
        headers: Vec<(String, String)>,
    ) -> PyResult<Reply> {
        let routes = self.routes.clone();
        let reply = block_on(py, async move {
            routes.call(method, path, &headers, body).await
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Reply::new(reply))
    }

    /// `openai` as an awaitable.
    #[pyo3(signature = (method, path, body, headers = Vec::new()))]
    fn openai_async<'py>(
        &self,
        py: Python<'py>,
        method: String,
        path: String,
        body: Vec<u8>,
        headers: Vec<(String, String)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let routes = self.routes.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let reply = routes
                .call(&method, &path, &headers, body)
                .await
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            Ok(Reply::new(reply))
        })
    }

    /// Aborts what is in flight and stops the engine thread; the engine answers nothing more.
    fn shutdown(&self, py: Python<'_>) {
        let engine = self.state.engine.clone();
        py.detach(|| engine.shutdown());
    }
}
