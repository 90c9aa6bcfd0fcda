//! Errors as the Python package's exceptions (`infer.errors`), carrying the server's
//! messages: a request the server would answer with a 4xx is a `RequestError` (a
//! `ValueError`, as vLLM raises for bad parameters) with its status, parameter and code.

use infer_api::prepare::RequestError;
use infer_core::serving::SubmitError;
use pyo3::prelude::*;
use pyo3::types::PyAnyMethods;

fn exception<A>(name: &str, args: A) -> PyErr
where
    A: for<'py> pyo3::call::PyCallArgs<'py>,
{
    Python::attach(|py| {
        let made = py
            .import("infer.errors")
            .and_then(|m| m.getattr(name))
            .and_then(|class| class.call1(args));
        match made {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        }
    })
}

/// A request the server refuses (4xx), as `infer.errors.RequestError`.
pub fn request_error(e: &RequestError) -> PyErr {
    exception(
        "RequestError",
        (e.message.clone(), e.status, e.param.clone(), e.code),
    )
}

/// The engine cannot run the request (stopped, failed), as `infer.errors.EngineError`.
pub fn engine_error(message: impl Into<String>) -> PyErr {
    exception("EngineError", (message.into(),))
}

/// The engine did not start (a refused setting, a model that does not load), as
/// `infer.errors.EngineStartError`.
pub fn start_error(message: impl Into<String>) -> PyErr {
    exception("EngineStartError", (message.into(),))
}

/// A request refused at submission: bad parameters and a full queue as the server words them.
pub fn submit_error(e: SubmitError, structured_param: Option<&'static str>) -> PyErr {
    match e {
        SubmitError::Invalid(e) => {
            request_error(&RequestError::from(e).structured_param(structured_param))
        }
        busy @ SubmitError::Busy { .. } => request_error(&RequestError::new(503, busy.to_string())),
        too_many @ SubmitError::TooManyPrompts { .. } => {
            request_error(&RequestError::bad_request(too_many.to_string()).param("prompt"))
        }
        SubmitError::Stopped => engine_error("the engine has stopped"),
    }
}
