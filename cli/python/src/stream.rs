//! A request's output stream and an OpenAI reply's body, read from Python either blocking
//! (the GIL released while waiting) or awaited on asyncio. Closing or dropping one drops the
//! engine stream under it, which aborts the request within one step.

use std::sync::Arc;

use infer_core::engine::{RequestMetrics, RequestOutput, SequenceDelta};
use infer_core::serving::{Event, Events};
use infer_web::InProcessReply;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::{json, Value};
use tokio::sync::Mutex;

use crate::errors::engine_error;

fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// Runs `fut` to its end on the package's runtime, the GIL released meanwhile.
pub fn block_on<F: std::future::Future + Send>(py: Python<'_>, fut: F) -> F::Output
where
    F::Output: Send,
{
    py.detach(|| runtime().block_on(fut))
}

/// One engine request's outputs, as JSON text for the Python layer to build vLLM's
/// `RequestOutput` from.
#[pyclass(module = "infer._infer", frozen)]
pub struct Stream {
    request_id: String,
    events: Arc<Mutex<Option<Events>>>,
}

impl Stream {
    pub fn new(request_id: String, events: Events) -> Self {
        Stream {
            request_id,
            events: Arc::new(Mutex::new(Some(events))),
        }
    }
}

async fn next_event(events: Arc<Mutex<Option<Events>>>) -> PyResult<Option<String>> {
    let mut guard = events.lock().await;
    let Some(rx) = guard.as_mut() else {
        return Ok(None);
    };
    match rx.recv().await {
        Some(Event::Output(out)) => {
            if out.finished() {
                *guard = None;
            }
            Ok(Some(output_json(&out).to_string()))
        }
        Some(Event::Failed { message, .. }) => {
            *guard = None;
            Err(engine_error(message))
        }
        None => {
            *guard = None;
            Ok(None)
        }
    }
}

/// The request's last output, the ones before it skipped here (not converted for Python).
async fn last_event(events: Arc<Mutex<Option<Events>>>) -> PyResult<Option<String>> {
    let mut guard = events.lock().await;
    loop {
        let Some(rx) = guard.as_mut() else {
            return Ok(None);
        };
        match rx.recv().await {
            Some(Event::Output(out)) if out.finished() => {
                *guard = None;
                return Ok(Some(output_json(&out).to_string()));
            }
            Some(Event::Output(_)) => {}
            Some(Event::Failed { message, .. }) => {
                *guard = None;
                return Err(engine_error(message));
            }
            None => {
                *guard = None;
                return Ok(None);
            }
        }
    }
}

#[pymethods]
impl Stream {
    #[getter]
    fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The next output as JSON, waiting for it; `None` once the request is over.
    fn next(&self, py: Python<'_>) -> PyResult<Option<String>> {
        block_on(py, next_event(self.events.clone()))
    }

    /// `next` as an awaitable.
    fn next_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pyo3_async_runtimes::tokio::future_into_py(py, next_event(self.events.clone()))
    }

    /// The finished output as JSON, waiting for it (earlier outputs are skipped); `None` if
    /// the request ended without one (aborted).
    fn last(&self, py: Python<'_>) -> PyResult<Option<String>> {
        block_on(py, last_event(self.events.clone()))
    }

    /// `last` as an awaitable.
    fn last_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pyo3_async_runtimes::tokio::future_into_py(py, last_event(self.events.clone()))
    }

    /// Drops the stream unless a read is waiting on it (then `Engine.abort` ends it): a
    /// request still running is aborted within a step.
    fn close(&self) {
        if let Ok(mut events) = self.events.try_lock() {
            events.take();
        }
    }
}

fn metrics_json(m: &RequestMetrics) -> Value {
    let since = |t: Option<std::time::Instant>| t.map(|t| (t - m.arrival).as_secs_f64());
    json!({
        "first_scheduled_time": since(m.first_scheduled),
        "first_token_time": since(m.first_token),
        "finished_time": since(m.finished),
        "num_prompt_tokens": m.num_prompt_tokens,
        "num_output_tokens": m.num_output_tokens,
        "num_preemptions": m.num_preemptions,
        "num_cached_tokens": m.num_cached_tokens,
    })
}

fn delta_json(d: &SequenceDelta) -> Value {
    json!({
        "index": d.index,
        "new_token_ids": d.new_token_ids,
        "text_delta": d.text_delta,
        "logprobs": d.logprobs,
        "finish_reason": d.finish_reason,
        "stop_reason": d.stop_reason,
    })
}

fn output_json(out: &RequestOutput) -> Value {
    json!({
        "request_id": out.request_id,
        "deltas": out.deltas.iter().map(delta_json).collect::<Vec<_>>(),
        "outputs": out.outputs,
        "prompt_logprobs": out.prompt_logprobs,
        "metrics": metrics_json(&out.metrics),
    })
}

/// An OpenAI reply from the server's routes: status and headers, then the body in chunks
/// (an SSE reply's events as they are made).
#[pyclass(module = "infer._infer", frozen)]
pub struct Reply {
    #[pyo3(get)]
    status: u16,
    #[pyo3(get)]
    headers: Vec<(String, String)>,
    body: Arc<Mutex<Option<InProcessReply>>>,
}

impl Reply {
    pub fn new(reply: InProcessReply) -> Self {
        Reply {
            status: reply.status,
            headers: reply.headers.clone(),
            body: Arc::new(Mutex::new(Some(reply))),
        }
    }
}

async fn next_chunk(body: Arc<Mutex<Option<InProcessReply>>>) -> PyResult<Option<Vec<u8>>> {
    let mut guard = body.lock().await;
    let Some(reply) = guard.as_mut() else {
        return Ok(None);
    };
    match reply.next_chunk().await {
        Some(Ok(bytes)) => Ok(Some(bytes.to_vec())),
        Some(Err(e)) => {
            *guard = None;
            Err(engine_error(e.to_string()))
        }
        None => {
            *guard = None;
            Ok(None)
        }
    }
}

#[pymethods]
impl Reply {
    /// The body's next chunk, waiting for it; `None` at its end.
    fn next_chunk<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let chunk = block_on(py, next_chunk(self.body.clone()))?;
        Ok(chunk.map(|c| PyBytes::new(py, &c)))
    }

    /// `next_chunk` as an awaitable (the chunk as `bytes`).
    fn next_chunk_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let body = self.body.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let chunk = next_chunk(body).await?;
            Ok(chunk.map(|c| Python::attach(|py| PyBytes::new(py, &c).unbind())))
        })
    }

    /// Drops the rest of the body unless a read is waiting on it (a stream still running is
    /// aborted).
    fn close(&self) {
        if let Ok(mut body) = self.body.try_lock() {
            body.take();
        }
    }
}
