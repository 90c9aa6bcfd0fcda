//! The served model's tokenizer (`llm.get_tokenizer()`): encode, decode and the chat template,
//! checked as the server's `/tokenize` and `/detokenize` check them.

use std::sync::Arc;

use infer_api::fields::parse_body;
use infer_api::types::TokenizeRequest;
use infer_web::ServerState;
use pyo3::prelude::*;

use crate::errors::request_error;

#[pyclass(module = "infer._infer", frozen)]
pub struct Tokenizer {
    state: Arc<ServerState>,
}

impl Tokenizer {
    pub fn new(state: Arc<ServerState>) -> Self {
        Tokenizer { state }
    }
}

#[pymethods]
impl Tokenizer {
    /// Token ids of `text` (with the tokenizer's special tokens when `add_special_tokens`).
    #[pyo3(signature = (text, add_special_tokens = true))]
    fn encode(&self, py: Python<'_>, text: &str, add_special_tokens: bool) -> PyResult<Vec<u32>> {
        let served = self.state.served();
        py.detach(|| {
            served.check_text_bytes(text.len(), "text")?;
            served
                .tokenizer
                .encode(text, add_special_tokens)
                .map_err(infer_api::prepare::RequestError::from)
        })
        .map_err(|e| request_error(&e))
    }

    /// The text of `token_ids`; ids outside the vocabulary raise.
    #[pyo3(signature = (token_ids, skip_special_tokens = true))]
    fn decode(&self, token_ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        let served = self.state.served();
        served
            .check_token_ids(&token_ids, "token_ids")
            .map_err(|e| request_error(&e))?;
        served
            .tokenizer
            .decode(&token_ids, skip_special_tokens)
            .map_err(|e| request_error(&e.into()))
    }

    /// The chat template's text (or its token ids with `tokenize`) for a `/tokenize` body
    /// with `messages` (JSON): tools, `chat_template_kwargs`, `add_generation_prompt`.
    #[pyo3(signature = (request_json, tokenize = false))]
    fn apply_chat_template(
        &self,
        py: Python<'_>,
        request_json: &str,
        tokenize: bool,
    ) -> PyResult<Py<PyAny>> {
        let served = self.state.served();
        let req: TokenizeRequest =
            parse_body(request_json.as_bytes()).map_err(|e| request_error(&e))?;
        if tokenize {
            let reply = py
                .detach(|| served.tokenize(&req))
                .map_err(|e| request_error(&e))?;
            let ids: Vec<u32> = serde_json::from_value(reply["tokens"].clone()).unwrap_or_default();
            Ok(ids.into_pyobject(py)?.into_any().unbind())
        } else {
            let text = py
                .detach(|| served.chat_text(&req))
                .map_err(|e| request_error(&e))?;
            Ok(text.into_pyobject(py)?.into_any().unbind())
        }
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.state.tokenizer.vocab_size()
    }

    #[getter]
    fn eos_token_id(&self) -> Option<u32> {
        self.state.tokenizer.eos_token_ids().first().copied()
    }

    #[getter]
    fn bos_token(&self) -> Option<String> {
        self.state.tokenizer.bos_token().map(str::to_string)
    }

    #[getter]
    fn eos_token(&self) -> Option<String> {
        self.state.tokenizer.eos_token().map(str::to_string)
    }

    #[getter]
    fn chat_template(&self) -> Option<String> {
        self.state.tokenizer.chat_template().map(str::to_string)
    }

    /// The token's text form for an id (`None` outside the vocabulary).
    fn convert_ids_to_tokens(&self, token_ids: Vec<u32>) -> Vec<Option<String>> {
        token_ids
            .iter()
            .map(|&id| self.state.tokenizer.id_to_token(id))
            .collect()
    }
}
