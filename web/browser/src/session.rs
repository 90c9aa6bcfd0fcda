//! The browser's requests: OpenAI-shaped bodies in (prepared by `infer-api`, as the server
//! does), engine outputs turned into the same stream chunks and replies `infer serve` sends.
//! Target-independent, so it is tested natively.

use std::collections::HashMap;
use std::sync::Arc;

use infer_api::fields::parse_body;
use infer_api::format::{
    completion_echo_choices, completion_stream_choices, CompletionReply, FinishedPrompt, Reply,
    RunningUsage, TokenNames, UsageCounter, CHAT, CHAT_CHUNK, COMPLETION,
};
use infer_api::prepare::{PreparedChat, Served};
use infer_api::tools::{ChatReplies, ToolCallParser};
use infer_api::{ChatRequest, CompletionRequest, RequestError, Usage};
use infer_core::{RequestOutput, SamplingParams, Tokenizer};
use serde::Serialize;
use serde_json::{json, Value};

/// What the page receives about a request.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A stream chunk, as `infer serve` sends in SSE.
    Chunk { id: String, chunk: Value },
    /// The request is over: the whole reply when it did not stream.
    Done {
        id: String,
        response: Option<Value>,
        aborted: bool,
    },
    /// The request failed (OpenAI's error body).
    Error { id: String, error: Value },
}

/// One engine request to add.
#[derive(Debug)]
pub struct EngineRequest {
    pub id: String,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// The field that asked for structured outputs (the engine's errors name it).
    pub structured_param: Option<&'static str>,
}

enum Kind {
    /// Replies read for tool calls as they come; its usage counts the request's.
    Chat(Box<ChatReplies>),
    Completion {
        prompts: Vec<Vec<u32>>,
        echo: bool,
        prompt_only: bool,
        prompt_logprobs: bool,
        /// Logprob tokens as `token_id:N` (`return_tokens_as_token_ids`).
        token_ids: bool,
    },
}

struct Active {
    reply: Reply,
    kind: Kind,
    n: usize,
    stream: bool,
    include_usage: bool,
    /// `continuous_usage_stats`: usage on every chunk.
    running: Option<RunningUsage>,
    usage: UsageCounter,
    /// One slot per engine request (per prompt), filled as each finishes.
    finished: Vec<Option<FinishedPrompt>>,
}

pub struct Session {
    tokenizer: Arc<Tokenizer>,
    model_name: String,
    max_model_len: usize,
    requests: HashMap<String, Active>,
    next_id: u64,
}

fn now_secs() -> u64 {
    web_time::SystemTime::now()
        .duration_since(web_time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Engine request ids are `{client id}#{prompt index}`.
fn split_engine_id(id: &str) -> Option<(&str, usize)> {
    let (client, index) = id.rsplit_once('#')?;
    Some((client, index.parse().ok()?))
}

impl Session {
    pub fn new(tokenizer: Arc<Tokenizer>, model_name: String, max_model_len: usize) -> Self {
        Session {
            tokenizer,
            model_name,
            max_model_len,
            requests: HashMap::new(),
            next_id: 0,
        }
    }

    pub fn tokenizer_arc(&self) -> Arc<Tokenizer> {
        self.tokenizer.clone()
    }

    /// The context requests are checked against (lowered to what the KV pool holds).
    pub fn set_max_model_len(&mut self, n: usize) {
        self.max_model_len = n;
    }

    /// `tokenize` (`{prompt, add_special_tokens}`) or `detokenize` (`{tokens}`), answered as
    /// `infer serve`'s `/tokenize` and `/detokenize` are.
    pub fn tokenizer_call(&self, endpoint: &str, body: &str) -> Result<Value, RequestError> {
        match endpoint {
            "tokenize" => self.served().tokenize(&parse_body(body.as_bytes())?),
            "detokenize" => self.served().detokenize(&parse_body(body.as_bytes())?),
            other => Err(RequestError::new(
                404,
                format!("no endpoint `{other}` (tokenize, detokenize)"),
            )),
        }
    }

    pub fn active_ids(&self) -> Vec<String> {
        self.requests.keys().cloned().collect()
    }

    fn served(&self) -> Served<'_> {
        Served {
            tokenizer: &self.tokenizer,
            model_name: &self.model_name,
            aliases: &[],
            max_model_len: self.max_model_len,
            tool_parser: ToolCallParser::detect(self.tokenizer.chat_template()),
            limits: Default::default(),
            defaults: infer_api::defaults::RequestDefaults::none(),
        }
    }

    /// A reply header; vLLM's `request_id`, when given, makes the id `{prefix}-{request_id}`.
    fn reply(&mut self, prefix: &str, request_id: Option<&str>) -> Reply {
        self.next_id += 1;
        Reply {
            id: match request_id {
                Some(r) => format!("{prefix}-{r}"),
                None => format!("{prefix}-web{:06x}", self.next_id),
            },
            created: now_secs(),
            model: self.model_name.clone(),
        }
    }

    /// Validates a `/v1/chat/completions` (`chat`) or `/v1/completions` body and returns the
    /// client's request id, the engine requests to add, and the first events (a chat stream's
    /// role chunk, an echoed prompt).
    pub fn prepare(
        &mut self,
        endpoint: &str,
        body: &str,
    ) -> Result<(String, Vec<EngineRequest>, Vec<Event>), RequestError> {
        let (reply, kind, prompts, params, structured_param, stream, (include_usage, continuous)) =
            match endpoint {
                "chat" => {
                    let req: ChatRequest = parse_body(body.as_bytes())?;
                    let PreparedChat {
                        prompt,
                        params,
                        structured_param,
                        tools,
                        echo,
                    } = self.served().chat(&req)?;
                    if req.prompt_logprobs.is_some() {
                        return Err(RequestError::bad_request(
                            "`prompt_logprobs` on chat is served by `infer serve`, not in the browser",
                        )
                        .param("prompt_logprobs"));
                    }
                    let usage = (
                        req.sampling.include_usage(),
                        req.sampling.continuous_usage(),
                    );
                    let reply = self.reply("chatcmpl", req.sampling.request_id.as_deref());
                    let replies = ChatReplies::new(tools, &reply.id)
                        .with_echo(echo)
                        .with_token_ids(req.sampling.return_tokens_as_token_ids == Some(true));
                    (
                        reply,
                        Kind::Chat(Box::new(replies)),
                        vec![prompt],
                        params,
                        structured_param,
                        req.sampling.stream,
                        usage,
                    )
                }
                "completion" => {
                    let req: CompletionRequest = parse_body(body.as_bytes())?;
                    let p = self.served().completion(&req)?;
                    let kind = Kind::Completion {
                        prompts: p.prompts.clone(),
                        echo: req.echo,
                        prompt_only: p.prompt_only,
                        prompt_logprobs: p.prompt_logprobs,
                        token_ids: req.sampling.return_tokens_as_token_ids == Some(true),
                    };
                    let usage = (
                        req.sampling.include_usage(),
                        req.sampling.continuous_usage(),
                    );
                    let reply = self.reply("cmpl", req.sampling.request_id.as_deref());
                    let structured = p.structured_param;
                    (
                        reply,
                        kind,
                        p.prompts,
                        p.params,
                        structured,
                        req.sampling.stream,
                        usage,
                    )
                }
                other => {
                    return Err(RequestError::bad_request(format!(
                        "unknown endpoint `{other}` (chat or completion)"
                    )))
                }
            };
        let id = reply.id.clone();
        let n = params.n;
        let running = continuous.then(|| RunningUsage::new(prompts.iter().map(Vec::len).collect()));
        let mut first = Vec::new();
        if stream {
            let head = match &kind {
                Kind::Chat(replies) => {
                    let usage = running.as_ref().map(|r| r.usage(0));
                    vec![reply.chunk(CHAT_CHUNK, Value::Array(replies.role_choices(n)), usage)]
                }
                Kind::Completion {
                    prompts,
                    echo: true,
                    ..
                } => completion_echo_choices(&self.tokenizer, prompts, n)?
                    .into_iter()
                    .map(|c| reply.chunk(COMPLETION, json!([c]), None))
                    .collect(),
                Kind::Completion { .. } => Vec::new(),
            };
            first.extend(head.into_iter().map(|chunk| Event::Chunk {
                id: id.clone(),
                chunk,
            }));
        }
        let engine = prompts
            .into_iter()
            .enumerate()
            .map(|(i, prompt)| EngineRequest {
                id: format!("{id}#{i}"),
                prompt,
                params: params.clone(),
                structured_param,
            })
            .collect::<Vec<_>>();
        self.requests.insert(
            id.clone(),
            Active {
                reply,
                kind,
                n,
                stream,
                include_usage,
                running,
                usage: UsageCounter::default(),
                finished: engine.iter().map(|_| None).collect(),
            },
        );
        Ok((id, engine, first))
    }

    /// The engine ids of a client request (to abort them).
    pub fn engine_ids(&self, id: &str) -> Vec<String> {
        self.requests
            .get(id)
            .map(|a| (0..a.finished.len()).map(|i| format!("{id}#{i}")).collect())
            .unwrap_or_default()
    }

    /// Forgets an aborted request and says so.
    pub fn abort(&mut self, id: &str) -> Option<Event> {
        self.requests.remove(id).map(|_| Event::Done {
            id: id.to_string(),
            response: None,
            aborted: true,
        })
    }

    /// Every live request fails with `why` (the engine stopped).
    pub fn fail_all(&mut self, why: &RequestError) -> Vec<Event> {
        self.requests
            .drain()
            .map(|(id, _)| Event::Error {
                id,
                error: why.body_with_status(),
            })
            .collect()
    }

    pub fn num_active(&self) -> usize {
        self.requests.len()
    }

    /// The events one engine output makes.
    pub fn on_output(&mut self, out: RequestOutput) -> Vec<Event> {
        let Some((client, index)) = split_engine_id(&out.request_id) else {
            return Vec::new();
        };
        let client = client.to_string();
        let tok = self.tokenizer.clone();
        let Some(a) = self.requests.get_mut(&client) else {
            return Vec::new();
        };
        let mut events = Vec::new();
        if a.stream {
            if let Some(r) = a.running.as_mut() {
                r.add(index, &out);
            }
            let usage = a.running.as_ref().map(|r| r.usage(index));
            let (object, choices) = match &mut a.kind {
                Kind::Chat(replies) => (CHAT_CHUNK, replies.stream_choices(&tok, &out)),
                Kind::Completion { token_ids, .. } => (
                    COMPLETION,
                    completion_stream_choices(
                        TokenNames::new(&tok, *token_ids),
                        &out,
                        index,
                        a.n,
                        &mut a.usage,
                    ),
                ),
            };
            // Chat sends each choice in a chunk of its own, completions one chunk per output.
            let chunks: Vec<Value> = if matches!(a.kind, Kind::Chat(_)) {
                choices.into_iter().map(|c| json!([c])).collect()
            } else {
                vec![Value::Array(choices)]
            };
            events.extend(chunks.into_iter().map(|c| Event::Chunk {
                id: client.clone(),
                chunk: a.reply.chunk(object, c, usage),
            }));
        }
        if let (Some(outputs), Some(slot)) = (out.outputs, a.finished.get_mut(index)) {
            *slot = Some(FinishedPrompt {
                outputs,
                prompt_len: out.metrics.num_prompt_tokens,
                cached: out.metrics.num_cached_tokens.unwrap_or(0),
                prompt_logprobs: out.prompt_logprobs.unwrap_or_default(),
            });
        }
        if a.finished.iter().all(Option::is_some) {
            if let Some(a) = self.requests.remove(&client) {
                events.extend(finish(&tok, &client, a));
            }
        }
        events
    }
}

/// The last events of a request whose engine requests all finished.
fn finish(tok: &Tokenizer, id: &str, a: Active) -> Vec<Event> {
    let mut events = Vec::new();
    if a.stream {
        if a.include_usage {
            let (object, usage) = match &a.kind {
                Kind::Chat(replies) => (CHAT_CHUNK, replies.usage.usage()),
                Kind::Completion { .. } => (COMPLETION, a.usage.usage()),
            };
            let chunk = a.reply.chunk(object, json!([]), Some(usage));
            events.push(Event::Chunk {
                id: id.to_string(),
                chunk,
            });
        }
        events.push(Event::Done {
            id: id.to_string(),
            response: None,
            aborted: false,
        });
        return events;
    }
    let finished: Vec<FinishedPrompt> = a.finished.into_iter().flatten().collect();
    let (object, built) = match &a.kind {
        Kind::Chat(replies) => {
            let prompt_tokens = finished.iter().map(|f| f.prompt_len).sum();
            let cached = finished.iter().map(|f| f.cached).sum();
            let (mut choices, mut completion_tokens) = (Vec::new(), 0);
            for f in &finished {
                for o in &f.outputs {
                    completion_tokens += o.token_ids.len();
                    choices.push(replies.choice(tok, o));
                }
            }
            let usage = Usage::new(prompt_tokens, completion_tokens).with_cached(cached);
            (CHAT, Ok((choices, usage)))
        }
        Kind::Completion {
            prompts,
            echo,
            prompt_only,
            prompt_logprobs,
            token_ids,
        } => {
            let builder = CompletionReply {
                n: a.n,
                echo: *echo,
                prompt_only: *prompt_only,
                prompt_logprobs: *prompt_logprobs,
                token_ids: *token_ids,
            };
            (COMPLETION, builder.choices(tok, prompts, finished))
        }
    };
    let (choices, usage) = match built {
        Ok(built) => built,
        Err(e) => {
            events.push(Event::Error {
                id: id.to_string(),
                error: e.body_with_status(),
            });
            return events;
        }
    };
    events.push(Event::Done {
        id: id.to_string(),
        response: Some(a.reply.response(object, choices, usage)),
        aborted: false,
    });
    events
}
