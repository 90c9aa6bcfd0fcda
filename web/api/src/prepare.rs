//! From a request body to engine input: prompts as token ids (chat messages through the model's
//! template), sampling parameters, and the checks a bad request fails with (a 4xx that names
//! the parameter).

use infer_core::{ChatMessage, SamplingParams, Tokenizer};

use crate::defaults::RequestDefaults;
use crate::fields::{apply_common, echoed, template_kwargs};
pub use crate::fields::{chat_messages, check_extra_fields};
use crate::tools::{self, prompt::write_into_messages, CallFormat, ToolCallParser, ToolPlan};
use crate::types::{ChatRequest, CompletionRequest, PromptInput};

pub use crate::error::RequestError;

/// The served model: what requests are checked against.
pub struct Served<'a> {
    pub tokenizer: &'a Tokenizer,
    pub model_name: &'a str,
    /// Other names requests may use for the model (vLLM's `--served-model-name A B`).
    pub aliases: &'a [String],
    pub max_model_len: usize,
    /// How replies are read for tool calls with `tool_choice: "auto"` (`None`: refused).
    pub tool_parser: Option<ToolCallParser>,
    pub limits: ChatLimits,
    /// What requests leave out (the model's generation config, default template variables).
    pub defaults: &'a RequestDefaults,
}

/// Bounds on a chat request, checked on the parsed body before anything is rendered, so a
/// request's memory is bounded before it is spent (each message and tool costs far more once
/// the template holds it than in the body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatLimits {
    /// `messages` per request (`--max-chat-messages`).
    pub max_messages: usize,
    /// `tools` per request (`--max-tools`; OpenAI allows 128).
    pub max_tools: usize,
    /// A request may bring its own `chat_template` (vLLM's `--trust-request-chat-template`:
    /// the server then runs the request's template code, bounded as the model's is).
    pub request_templates: bool,
}

impl Default for ChatLimits {
    fn default() -> Self {
        ChatLimits {
            max_messages: 2048,
            max_tools: 256,
            request_templates: false,
        }
    }
}

/// Bytes of `value` as JSON, counted without building the text.
fn json_len(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail; a value that cannot serialize counts as nothing.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// A completion request ready for the engine: one prompt per engine request.
pub struct PreparedCompletion {
    pub prompts: Vec<Vec<u32>>,
    pub params: SamplingParams,
    /// The field that asked for structured outputs (engine errors about it name this).
    pub structured_param: Option<&'static str>,
    /// `echo` with `max_tokens: 0`: score the prompt alone (the one generated token is dropped).
    pub prompt_only: bool,
    /// vLLM's `prompt_logprobs` asked for: each choice carries them.
    pub prompt_logprobs: bool,
}

/// A chat request ready for the engine.
pub struct PreparedChat {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub structured_param: Option<&'static str>,
    /// How the replies are read for tool calls (`None`: plain text).
    pub tools: Option<ToolPlan>,
    /// vLLM's chat `echo`: the text each choice's content starts with.
    pub echo: Option<String>,
}

impl Served<'_> {
    /// 404 for a model name not served (absent = the served one).
    pub fn check_model(&self, model: Option<&str>) -> Result<(), RequestError> {
        match model {
            Some(m) if m != self.model_name && !self.aliases.iter().any(|a| a == m) => {
                Err(RequestError::new(
                    404,
                    format!(
                        "the model `{m}` does not exist; this server serves `{}`",
                        self.model_name
                    ),
                )
                .param("model")
                .code("model_not_found"))
            }
            _ => Ok(()),
        }
    }

    /// Refuses, before tokenizing it, a text so long that it cannot fit the context in any
    /// tokenization (with a margin of 4 for normalizers that shrink text).
    pub fn check_text_bytes(&self, bytes: usize, param: &str) -> Result<(), RequestError> {
        let per_token = self.tokenizer.max_token_bytes();
        let limit = self
            .max_model_len
            .saturating_mul(per_token)
            .saturating_mul(4);
        if bytes > limit {
            return Err(RequestError::bad_request(format!(
                "the prompt is {bytes} bytes: at least {} tokens, more than the model's context of {} tokens",
                bytes / (per_token * 4),
                self.max_model_len
            ))
            .param(param)
            .code("context_length_exceeded"));
        }
        Ok(())
    }

    /// The chat limits and the context bound on the parsed request, before anything is
    /// rendered: message and tool counts, then their text (contents plus the tools' JSON)
    /// against what the context could hold in any tokenization.
    pub fn check_chat_size(
        &self,
        messages: &[crate::types::ChatMessageIn],
        tools: Option<&[crate::types::Tool]>,
    ) -> Result<(), RequestError> {
        let limits = self.limits;
        let tools = tools.unwrap_or_default();
        for (field, count, max, flag) in [
            (
                "messages",
                messages.len(),
                limits.max_messages,
                "--max-chat-messages",
            ),
            ("tools", tools.len(), limits.max_tools, "--max-tools"),
        ] {
            if count > max {
                return Err(RequestError::bad_request(format!(
                    "{count} {field}; this server takes at most {max} per request ({flag})"
                ))
                .param(field));
            }
        }
        let tool_bytes = if tools.is_empty() {
            0
        } else {
            json_len(&tools)
        };
        self.check_text_bytes(tool_bytes, "tools")?;
        let bytes = messages.iter().map(json_len).sum::<usize>() + tool_bytes;
        self.check_text_bytes(bytes, "messages")
    }

    /// Token ids of a rendered chat template, after checking its size: a template's own text
    /// (per-message markup) can take a request past the context bound.
    pub fn encode_rendered(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, RequestError> {
        self.check_text_bytes(text.len(), "messages")?;
        Ok(self.tokenizer.encode(text, add_special_tokens)?)
    }

    /// Token ids of each prompt (text prompts with the tokenizer's special tokens when
    /// `add_special_tokens`).
    pub fn encode_prompts(
        &self,
        prompt: &PromptInput,
        add_special_tokens: bool,
    ) -> Result<Vec<Vec<u32>>, RequestError> {
        let encode = |t: &str| {
            self.check_text_bytes(t.len(), "prompt")?;
            self.tokenizer
                .encode(t, add_special_tokens)
                .map_err(RequestError::from)
        };
        let prompts = match prompt {
            PromptInput::Text(t) => vec![encode(t)?],
            PromptInput::Texts(ts) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
            PromptInput::Tokens(ids) => vec![ids.clone()],
            PromptInput::TokenLists(l) => l.clone(),
        };
        if prompts.is_empty() {
            return Err(RequestError::bad_request("`prompt` is empty").param("prompt"));
        }
        Ok(prompts)
    }

    /// Prompt + `max_tokens` must fit the context (vLLM's rule).
    pub fn check_length(
        &self,
        prompt_len: usize,
        max_tokens: Option<usize>,
    ) -> Result<(), RequestError> {
        let max = self.max_model_len;
        if prompt_len >= max {
            return Err(RequestError::bad_request(format!(
                "the prompt has {prompt_len} tokens but the model's context is {max} tokens"
            ))
            .param("prompt")
            .code("context_length_exceeded"));
        }
        if let Some(m) = max_tokens {
            if prompt_len + m > max {
                return Err(RequestError::bad_request(format!(
                    "prompt ({prompt_len} tokens) + max_tokens ({m}) exceeds the model's context of {max} tokens"
                ))
                .param("max_tokens")
                .code("context_length_exceeded"));
            }
        }
        Ok(())
    }

    pub fn completion(&self, req: &CompletionRequest) -> Result<PreparedCompletion, RequestError> {
        self.check_model(req.model.as_deref())?;
        let mut prompts =
            self.encode_prompts(&req.prompt, req.add_special_tokens.unwrap_or(true))?;
        for p in &mut prompts {
            self.truncate(p, req.sampling.truncate_prompt_tokens)?;
        }
        if req.echo && req.sampling.stream && req.logprobs.is_some() {
            return Err(RequestError::bad_request(
                "`echo` with `logprobs` is not supported when streaming; send `stream: false`",
            )
            .param("echo"));
        }
        // `echo` with `max_tokens: 0` scores the prompt alone: the engine generates one token
        // (prompt logprobs come with the first) and the reply drops it.
        let prompt_only = req.echo && req.max_tokens == Some(0);
        let max_tokens = if prompt_only {
            Some(1)
        } else {
            self.defaults.max_tokens(req.max_tokens, Some(16))
        };
        let mut params = req
            .sampling
            .to_params(max_tokens, req.logprobs, self.defaults)?;
        if req.echo && req.logprobs.is_some() {
            params.prompt_logprobs = req.logprobs;
        }
        if let Some(k) = req.prompt_logprobs {
            let bad = |msg: &str| Err(RequestError::bad_request(msg).param("prompt_logprobs"));
            if req.sampling.stream {
                return bad(
                    "`prompt_logprobs` is not supported when streaming; send `stream: false`",
                );
            }
            if params.prompt_logprobs.is_some_and(|e| e != k) {
                return bad(
                    "`prompt_logprobs` must equal `logprobs` when `echo` also scores the prompt",
                );
            }
            params.prompt_logprobs = Some(k);
        }
        let structured_param =
            apply_common(&req.extra, &req.structured, &req.sampling, &mut params)?;
        params.validate()?;
        for p in &prompts {
            self.check_length(p.len(), max_tokens)?;
        }
        Ok(PreparedCompletion {
            prompts,
            params,
            structured_param,
            prompt_only,
            prompt_logprobs: req.prompt_logprobs.is_some(),
        })
    }

    pub fn chat(&self, req: &ChatRequest) -> Result<PreparedChat, RequestError> {
        self.check_model(req.model.as_deref())?;
        if req.messages.is_empty() {
            return Err(RequestError::bad_request("`messages` is empty").param("messages"));
        }
        self.check_chat_size(&req.messages, req.tools.as_deref())?;
        if req.chat_template.is_some() && !self.limits.request_templates {
            // vLLM's default too: a template is code the server runs.
            return Err(RequestError::bad_request(
                "this server does not take chat templates from requests (start it with --trust-request-chat-template to allow them); it renders with the model's (or --chat-template)",
            )
            .param("chat_template"));
        }
        let kwargs = template_kwargs(req, self.defaults);
        let tools = tools::setup(
            req.tools.as_deref(),
            req.tool_choice.as_ref(),
            req.parallel_tool_calls,
            self.tool_parser,
        )?;
        let text = self.render(
            req.chat_template.as_deref(),
            chat_messages(&req.messages)?,
            tools.shown.as_ref(),
            kwargs.as_ref(),
            req.add_generation_prompt,
            req.continue_final_message,
        )?;
        // The rendered template already holds its special tokens (unless asked otherwise).
        let mut prompt = self.encode_rendered(&text, req.add_special_tokens.unwrap_or(false))?;
        self.truncate(&mut prompt, req.sampling.truncate_prompt_tokens)?;
        let max_tokens = self
            .defaults
            .max_tokens(req.max_completion_tokens.or(req.max_tokens), None);
        if req.top_logprobs.is_some() && !req.logprobs {
            // OpenAI's rule; how many the engine reports at most is --max-logprobs.
            return Err(
                RequestError::bad_request("`top_logprobs` needs `logprobs: true`")
                    .param("top_logprobs"),
            );
        }
        let logprobs = req.logprobs.then(|| req.top_logprobs.unwrap_or(0));
        let mut params = req
            .sampling
            .to_params(max_tokens, logprobs, self.defaults)?;
        if let Some(k) = req.prompt_logprobs {
            if req.sampling.stream {
                return Err(RequestError::bad_request(
                    "`prompt_logprobs` is not supported when streaming; send `stream: false`",
                )
                .param("prompt_logprobs"));
            }
            params.prompt_logprobs = Some(k);
        }
        let mut structured_param =
            apply_common(&req.extra, &req.structured, &req.sampling, &mut params)?;
        if let Some(constraint) = tools.constraint {
            if let Some(other) = structured_param {
                return Err(RequestError::bad_request(format!(
                    "this tool_choice constrains the output to a call; it cannot be combined with `{other}`"
                ))
                .param("tool_choice"));
            }
            params.structured_outputs = Some(constraint);
            structured_param = Some("tools");
        }
        let hermes = CallFormat::Parsed(ToolCallParser::Hermes);
        if tools.plan.as_ref().is_some_and(|p| p.format == hermes)
            && req.sampling.skip_special_tokens.is_none()
            && self.tokenizer.token_to_id("<tool_call>").is_some()
        {
            // Models trained on Hermes's format have `<tool_call>` as a special token: keep
            // it in the text, where the parser looks for it (vLLM does the same).
            params.skip_special_tokens = false;
        }
        params.validate()?;
        self.check_length(prompt.len(), max_tokens)?;
        Ok(PreparedChat {
            prompt,
            params,
            structured_param,
            tools: tools.plan,
            echo: req.echo.then(|| echoed(req)).flatten(),
        })
    }

    /// vLLM's `truncate_prompt_tokens`: the prompt's last `keep` tokens (-1: as many as the
    /// context holds).
    pub(crate) fn truncate(
        &self,
        prompt: &mut Vec<u32>,
        keep: Option<i64>,
    ) -> Result<(), RequestError> {
        let bad = |m: String| Err(RequestError::bad_request(m).param("truncate_prompt_tokens"));
        let keep = match keep {
            None => return Ok(()),
            Some(-1) => self.max_model_len,
            Some(k) if k < 1 => return bad(format!("{k} must be -1 or at least 1")),
            Some(k) if k as u64 > self.max_model_len as u64 => {
                return bad(format!(
                    "{k} is more than the model's context of {} tokens",
                    self.max_model_len
                ))
            }
            // Positive and at most the context, checked above.
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        if prompt.len() > keep {
            prompt.drain(..prompt.len() - keep);
        }
        Ok(())
    }

    /// The prompt text: the template with a new assistant turn opened, or (vLLM's
    /// `continue_final_message`) cut right after the last message so the reply continues it.
    /// `tools` go to the template, or into the messages for a template that does not take them.
    /// `template` is the request's own (`None`: the model's).
    pub(crate) fn render(
        &self,
        template: Option<&str>,
        messages: Vec<ChatMessage>,
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
        add_generation_prompt: Option<bool>,
        continue_final_message: bool,
    ) -> Result<String, RequestError> {
        let takes_tools = template
            .or(self.tokenizer.chat_template())
            .is_some_and(infer_core::template_takes_tools);
        let (messages, tools) = if takes_tools {
            (messages, tools)
        } else {
            let parser = self.tool_parser.unwrap_or(ToolCallParser::Hermes);
            (write_into_messages(messages, tools, parser), None)
        };
        let template = |open: bool| {
            self.tokenizer
                .apply_chat_template_from(template, &messages, tools, kwargs, open)
                .map_err(|e| match (e, template, kwargs) {
                    // A request's own template that fails names it; the model's, when it
                    // fails on the request's variables, names them.
                    (e @ infer_core::InferError::ChatTemplate(_), Some(_), _) => {
                        RequestError::bad_request(e.to_string()).param("chat_template")
                    }
                    (e @ infer_core::InferError::ChatTemplate(_), None, Some(_)) => {
                        RequestError::bad_request(e.to_string()).param("chat_template_kwargs")
                    }
                    (e, _, _) => e.into(),
                })
        };
        if !continue_final_message {
            return template(add_generation_prompt.unwrap_or(true));
        }
        if add_generation_prompt == Some(true) {
            return Err(RequestError::bad_request(
                "`continue_final_message` and `add_generation_prompt` cannot both be true",
            )
            .param("continue_final_message"));
        }
        let last = messages
            .last()
            .map(|m| m.content.as_str())
            .unwrap_or_default();
        let text = template(false)?;
        match text.rfind(last) {
            Some(at) if !last.is_empty() => Ok(text[..at + last.len()].to_string()),
            _ => Err(RequestError::bad_request(
                "`continue_final_message` needs a last message with content the template keeps",
            )
            .param("continue_final_message")),
        }
    }
}
