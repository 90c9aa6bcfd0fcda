//! OpenAI's Responses API (`POST /v1/responses`), stateless (`store: false`, as vLLM without
//! its store): a request becomes a chat request (`instructions` as the system message, input
//! items as messages, flat function tools as chat tools, `text.format` as `response_format`),
//! and the chat reply becomes output items (`reasoning`, `message`, `function_call`), whole
//! or as the API's stream events.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::RequestError;
use crate::types::{ChatRequest, Usage};

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// A string (one user message) or a list of input items.
    pub input: Value,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", ...}}`.
    pub text: Option<Value>,
    /// `{"effort": "low" | ...}`: the template's `reasoning_effort`.
    pub reasoning: Option<Value>,
    #[serde(default)]
    pub stream: bool,
    /// Nothing is stored: absent or `false` only.
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    pub metadata: Option<Value>,
    /// Every other field, through the chat request's policy (sampling extras such as `seed`,
    /// `top_k` are honoured there; unknown ones refused by name).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn bad(message: impl Into<String>, param: &str) -> RequestError {
    RequestError::bad_request(message).param(param)
}

/// An input item's content as chat content: a string, or its text parts.
fn content(value: &Value, at: &str) -> Result<Value, RequestError> {
    match value {
        Value::String(_) => Ok(value.clone()),
        Value::Array(parts) => {
            let mut out = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => {
                        out.push(json!({"type": "text", "text": t}))
                    }
                    (kind, _) => {
                        return Err(bad(
                            format!(
                                "content parts of type `{}` are not supported: the served model takes text only",
                                kind.unwrap_or("?")
                            ),
                            &format!("{at}.content[{j}].type"),
                        ))
                    }
                }
            }
            Ok(Value::Array(out))
        }
        _ => Err(bad(
            "expected a string or a list of parts",
            &format!("{at}.content"),
        )),
    }
}

/// The input items as chat messages (function calls and their outputs included).
fn messages(req: &ResponsesRequest) -> Result<Vec<Value>, RequestError> {
    let mut msgs = Vec::new();
    if let Some(i) = &req.instructions {
        msgs.push(json!({"role": "system", "content": i}));
    }
    let items = match &req.input {
        Value::String(s) => return Ok([msgs, vec![json!({"role": "user", "content": s})]].concat()),
        Value::Array(items) => items,
        _ => return Err(bad("expected a string or a list of items", "input")),
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        let field = |k: &str| item.get(k).and_then(Value::as_str);
        match kind {
            "message" => {
                let role = field("role").ok_or_else(|| bad("a message needs a `role`", &at))?;
                let role = if role == "developer" { "system" } else { role };
                let c = item.get("content").unwrap_or(&Value::Null);
                msgs.push(json!({"role": role, "content": content(c, &at)?}));
            }
            "function_call" => {
                let call = json!({"id": field("call_id").unwrap_or_default(), "type": "function",
                    "function": {"name": field("name").unwrap_or_default(),
                                 "arguments": field("arguments").unwrap_or("{}")}});
                // Consecutive calls are one assistant turn.
                match msgs.last_mut() {
                    Some(last) if last["role"] == "assistant" && last["tool_calls"].is_array() => {
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => msgs
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => msgs.push(json!({"role": "tool",
                "tool_call_id": field("call_id").unwrap_or_default(),
                "content": item.get("output").cloned().unwrap_or(Value::Null)})),
            other => {
                return Err(bad(
                    format!("input items of type `{other}` are not supported"),
                    &format!("{at}.type"),
                ))
            }
        }
    }
    Ok(msgs)
}

/// The request as a chat request (checked there like any other).
pub fn to_chat(req: &ResponsesRequest) -> Result<ChatRequest, RequestError> {
    if req.store == Some(true) {
        return Err(bad(
            "responses are not stored here: send `store: false`",
            "store",
        ));
    }
    if req.previous_response_id.is_some() {
        return Err(bad(
            "responses are not stored here, so none can be continued: send the conversation in `input`",
            "previous_response_id",
        ));
    }
    let mut chat = req.extra.clone();
    chat.insert("messages".into(), Value::Array(messages(req)?));
    for (k, v) in [
        ("model", req.model.as_ref().map(|m| json!(m))),
        (
            "max_completion_tokens",
            req.max_output_tokens.map(|m| json!(m)),
        ),
        ("temperature", req.temperature.map(|t| json!(t))),
        ("top_p", req.top_p.map(|t| json!(t))),
        (
            "parallel_tool_calls",
            req.parallel_tool_calls.map(|p| json!(p)),
        ),
        ("stream", Some(json!(req.stream))),
    ] {
        if let Some(v) = v {
            chat.insert(k.into(), v);
        }
    }
    if let Some(effort) = req.reasoning.as_ref().and_then(|r| r.get("effort")) {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    if let Some(tools) = &req.tools {
        let mut out = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad(
                    "only function tools are supported (built-in tools are not run here)",
                    &format!("tools[{i}].type"),
                ));
            }
            let mut f = Map::new();
            for k in ["name", "description", "parameters", "strict"] {
                if let Some(v) = t.get(k) {
                    f.insert(k.into(), v.clone());
                }
            }
            out.push(json!({"type": "function", "function": f}));
        }
        chat.insert("tools".into(), Value::Array(out));
    }
    if let Some(choice) = &req.tool_choice {
        let choice = match choice.get("name") {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => choice.clone(),
        };
        chat.insert("tool_choice".into(), choice);
    }
    match req.text.as_ref().and_then(|t| t.get("format")) {
        None => {}
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => {
                chat.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                let mut schema = f.clone();
                if let Some(o) = schema.as_object_mut() {
                    o.remove("type");
                }
                chat.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": schema}),
                );
            }
            _ => {
                return Err(bad(
                    "expected text, json_object or json_schema",
                    "text.format.type",
                ))
            }
        },
    }
    serde_json::from_value(Value::Object(chat))
        .map_err(|e| bad(format!("invalid request: {e}"), "input"))
}

/// The output items of a finished chat choice (its `message`): reasoning, the message, calls.
pub fn output_items(id: &str, message: &Value) -> Vec<Value> {
    let mut items = Vec::new();
    if let Some(r) = message.get("reasoning_content").and_then(Value::as_str) {
        items.push(reasoning_item(id, r, "completed"));
    }
    if let Some(text) = message.get("content").and_then(Value::as_str) {
        if !text.is_empty() || message.get("tool_calls").is_none() {
            items.push(message_item(id, text, "completed"));
        }
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        items.push(call_item(call, &call["function"]["arguments"], "completed"));
    }
    items
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": format!("rs_{id}"), "status": status, "summary": [],
        "content": [{"type": "reasoning_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{id}"), "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

/// A `function_call` item of a chat tool call (`{id, function: {name, ...}}`).
fn call_item(call: &Value, arguments: &Value, status: &str) -> Value {
    let call_id = call["id"].as_str().unwrap_or_default();
    json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
        "name": call["function"]["name"], "arguments": arguments, "status": status})
}

/// The response object around `output`.
pub fn response(
    req: &ResponsesRequest,
    id: &str,
    created: u64,
    model: &str,
    output: Vec<Value>,
    finish_reason: Option<&str>,
    usage: Option<Usage>,
) -> Value {
    let (status, incomplete) = match finish_reason {
        None => ("in_progress", Value::Null),
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some(_) => ("completed", Value::Null),
    };
    json!({
        "id": format!("resp_{id}"),
        "object": "response",
        "created_at": created,
        "model": model,
        "status": status,
        "incomplete_details": incomplete,
        "error": null,
        "output": output,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tools": req.tools.clone().unwrap_or_default(),
        "tool_choice": req.tool_choice.clone().unwrap_or(json!("auto")),
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "text": req.text.clone().unwrap_or(json!({"format": {"type": "text"}})),
        "metadata": req.metadata.clone().unwrap_or(json!({})),
        "previous_response_id": null,
        "store": false,
        "usage": usage.map(|u| json!({
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens,
        })),
    })
}

/// What is open while a response streams: the reasoning and message items as their text
/// grows, and function calls as their arguments arrive; events numbered in order.
#[derive(Debug, Default)]
pub struct ResponseStream {
    id: String,
    sequence: u64,
    /// Output items so far (finished or not), in order.
    items: Vec<Value>,
    reasoning: Option<usize>,
    message: Option<usize>,
    /// Each streamed tool call: its `delta.tool_calls[].index` and its output index.
    calls: Vec<(usize, usize)>,
}

impl ResponseStream {
    pub fn new(id: &str) -> Self {
        ResponseStream {
            id: id.to_string(),
            ..Default::default()
        }
    }

    /// One event: `(type, data)`, `data` carrying `type` and `sequence_number`.
    pub fn event(&mut self, kind: &str, mut data: Value) -> (String, Value) {
        data["type"] = kind.into();
        data["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        (kind.to_string(), data)
    }

    /// The item `slot` points at, opened (added) on first use.
    fn open(&mut self, reasoning: bool, events: &mut Vec<(String, Value)>) -> usize {
        let slot = if reasoning {
            self.reasoning
        } else {
            self.message
        };
        if let Some(i) = slot {
            return i;
        }
        let i = self.items.len();
        let item = if reasoning {
            reasoning_item(&self.id, "", "in_progress")
        } else {
            message_item(&self.id, "", "in_progress")
        };
        self.items.push(item.clone());
        let e = self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
        );
        events.push(e);
        let part = if reasoning {
            json!({"type": "reasoning_text", "text": ""})
        } else {
            json!({"type": "output_text", "text": "", "annotations": []})
        };
        let e = self.event(
            "response.content_part.added",
            json!({"item_id": self.item_id(i),
            "output_index": i, "content_index": 0, "part": part}),
        );
        events.push(e);
        if reasoning {
            self.reasoning = Some(i);
        } else {
            self.message = Some(i);
        }
        i
    }

    fn item_id(&self, i: usize) -> Value {
        self.items[i]["id"].clone()
    }

    /// The events one streamed chat choice (`{delta: {...}}`) adds.
    pub fn push(&mut self, choice: &Value) -> Vec<(String, Value)> {
        let mut events = Vec::new();
        let delta = &choice["delta"];
        for (reasoning, key, kind) in [
            (true, "reasoning_content", "response.reasoning_text.delta"),
            (false, "content", "response.output_text.delta"),
        ] {
            let Some(text) = delta
                .get(key)
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
            else {
                continue;
            };
            let i = self.open(reasoning, &mut events);
            let so_far = &mut self.items[i]["content"][0]["text"];
            *so_far = format!("{}{text}", so_far.as_str().unwrap_or_default()).into();
            let e = self.event(
                kind,
                json!({"item_id": self.item_id(i), "output_index": i,
                "content_index": 0, "delta": text}),
            );
            events.push(e);
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = call["index"].as_u64().unwrap_or(0);
            let index = usize::try_from(index).unwrap_or(usize::MAX);
            let i = self.open_call(index, call, &mut events);
            if let Some(piece) = call["function"]
                .get("arguments")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
            {
                let item = &mut self.items[i];
                let whole = format!("{}{piece}", item["arguments"].as_str().unwrap_or_default());
                item["arguments"] = whole.into();
                let e = self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": self.item_id(i), "output_index": i, "delta": piece}),
                );
                events.push(e);
            }
        }
        events
    }

    /// The function-call item of the chat stream's call `index`, added when its first delta
    /// (id and name) arrives.
    fn open_call(
        &mut self,
        index: usize,
        call: &Value,
        events: &mut Vec<(String, Value)>,
    ) -> usize {
        if let Some(&(_, i)) = self.calls.iter().find(|(c, _)| *c == index) {
            return i;
        }
        let i = self.items.len();
        // The delta's own arguments piece is added by the caller, as every later one is.
        let item = call_item(call, &json!(""), "in_progress");
        self.items.push(item.clone());
        self.calls.push((index, i));
        let e = self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
        );
        events.push(e);
        i
    }

    /// The closing events: each open item done, the calls, then the output for
    /// `response.completed`.
    pub fn finish(&mut self) -> (Vec<(String, Value)>, Vec<Value>) {
        let mut events = Vec::new();
        for (slot, done) in [
            (self.reasoning, "response.reasoning_text.done"),
            (self.message, "response.output_text.done"),
        ] {
            let Some(i) = slot else { continue };
            self.items[i]["status"] = "completed".into();
            let text = self.items[i]["content"][0]["text"].clone();
            let id = self.item_id(i);
            let e = self.event(
                done,
                json!({"item_id": id, "output_index": i, "content_index": 0, "text": text}),
            );
            events.push(e);
            let part = self.items[i]["content"][0].clone();
            let e = self.event(
                "response.content_part.done",
                json!({"item_id": id,
                "output_index": i, "content_index": 0, "part": part}),
            );
            events.push(e);
            let item = self.items[i].clone();
            let e = self.event(
                "response.output_item.done",
                json!({"output_index": i, "item": item}),
            );
            events.push(e);
        }
        for (_, i) in std::mem::take(&mut self.calls) {
            self.items[i]["status"] = "completed".into();
            let item = self.items[i].clone();
            let e = self.event(
                "response.function_call_arguments.done",
                json!({"item_id": item["id"],
                "output_index": i, "arguments": item["arguments"]}),
            );
            events.push(e);
            let e = self.event(
                "response.output_item.done",
                json!({"output_index": i, "item": item}),
            );
            events.push(e);
        }
        (events, self.items.clone())
    }
}
