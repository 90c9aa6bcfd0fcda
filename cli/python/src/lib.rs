//! `infer._infer`: the engine behind the `infer` Python package. The Python layer (`LLM`,
//! `AsyncLLM`, `SamplingParams`, the Ray deployments) is thin: requests are checked and
//! turned into engine input by the server's own code (`infer-api`, with its error messages),
//! run on the server's asynchronous engine (`infer_core::serving`), and OpenAI requests go
//! through the server's routes in process, so every front end answers alike.

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]

mod engine;
mod errors;
mod stream;
mod tokenizer;

use pyo3::prelude::*;

/// Logs through `tracing` to stderr, filtered by `INFER_LOG` (default `warn`), once per
/// process.
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("INFER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[pymodule]
fn _infer(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logs();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<engine::Prepared>()?;
    m.add_class::<stream::Stream>()?;
    m.add_class::<stream::Reply>()?;
    m.add_class::<tokenizer::Tokenizer>()?;
    m.add_function(wrap_pyfunction!(engine::check_sampling, m)?)?;
    Ok(())
}
