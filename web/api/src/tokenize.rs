//! vLLM's tokenizer endpoints as the served model answers them: `/tokenize` (a prompt, or
//! chat messages through the template), `/detokenize` and `/tokenizer_info`.

use crate::error::RequestError;
use crate::prepare::{chat_messages, Served};
use crate::tools;
use crate::types::{DetokenizeRequest, TokenizeRequest};

impl Served<'_> {
    /// vLLM's `/tokenize` reply: `{count, max_model_len, tokens}` (+ `token_strs`).
    pub fn tokenize(&self, req: &TokenizeRequest) -> Result<serde_json::Value, RequestError> {
        self.check_model(req.model.as_deref())?;
        let tokens = match (&req.prompt, &req.messages) {
            (Some(_), None) if req.chat_template_kwargs.is_some() => {
                return Err(RequestError::bad_request(
                    "`chat_template_kwargs` go with `messages` (the template reads them), not with `prompt`",
                )
                .param("chat_template_kwargs"))
            }
            (Some(_), None) if req.tools.is_some() => {
                return Err(RequestError::bad_request(
                    "`tools` go with `messages` (the template shows them), not with `prompt`",
                )
                .param("tools"))
            }
            (Some(prompt), None) => {
                self.check_text_bytes(prompt.len(), "prompt")?;
                self.tokenizer
                    .encode(prompt, req.add_special_tokens.unwrap_or(true))?
            }
            (None, Some(_)) => {
                let text = self.chat_text(req)?;
                self.encode_rendered(&text, req.add_special_tokens.unwrap_or(false))?
            }
            _ => {
                return Err(RequestError::bad_request(
                    "send exactly one of `prompt` and `messages`",
                )
                .param("prompt"))
            }
        };
        let mut reply = serde_json::json!({
            "count": tokens.len(),
            "max_model_len": self.max_model_len,
            "tokens": tokens,
        });
        if req.return_token_strs {
            let strs: Vec<Option<String>> = tokens
                .iter()
                .map(|&t| self.tokenizer.id_to_token(t))
                .collect();
            reply["token_strs"] = serde_json::json!(strs);
        }
        Ok(reply)
    }

    /// The chat template's text for a `/tokenize` request's `messages` (with its `tools`,
    /// variables and generation prompt), checked as a chat request's are.
    pub fn chat_text(&self, req: &TokenizeRequest) -> Result<String, RequestError> {
        let Some(messages) = &req.messages else {
            return Err(RequestError::bad_request("`messages` is missing").param("messages"));
        };
        self.check_chat_size(messages, req.tools.as_deref())?;
        let messages = chat_messages(messages)?;
        let tools = match &req.tools {
            Some(t) if !t.is_empty() => {
                tools::check_tools(t)?;
                Some(serde_json::json!(t))
            }
            _ => None,
        };
        self.render(
            None,
            messages,
            tools.as_ref(),
            req.chat_template_kwargs.as_ref(),
            req.add_generation_prompt,
            req.continue_final_message,
        )
    }

    /// vLLM's `GET /tokenizer_info`: what a client needs to tokenize and template as the
    /// server does (lm-evaluation-harness's remote tokenizer reads it).
    pub fn tokenizer_info(&self) -> serde_json::Value {
        let t = self.tokenizer;
        serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": t.bos_token(),
            "eos_token": t.eos_token(),
            "pad_token": null,
            "chat_template": t.chat_template(),
            "model_max_length": self.max_model_len,
            "vocab_size": t.vocab_size(),
            "eos_token_ids": t.eos_token_ids(),
        })
    }

    /// vLLM's `/detokenize` reply: `{prompt}`; ids outside the vocabulary are a 400.
    pub fn detokenize(&self, req: &DetokenizeRequest) -> Result<serde_json::Value, RequestError> {
        self.check_model(req.model.as_deref())?;
        self.check_token_ids(&req.tokens, "tokens")?;
        let text = self.tokenizer.decode(&req.tokens, false)?;
        Ok(serde_json::json!({ "prompt": text }))
    }

    /// A 400 naming `param` for the first id outside the vocabulary.
    pub fn check_token_ids(&self, ids: &[u32], param: &str) -> Result<(), RequestError> {
        let vocab = self.tokenizer.vocab_size();
        match ids.iter().find(|&&t| t as usize >= vocab) {
            Some(t) => Err(RequestError::bad_request(format!(
                "token {t} is outside the vocabulary of {vocab}"
            ))
            .param(param)),
            None => Ok(()),
        }
    }
}
