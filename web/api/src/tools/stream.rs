//! One choice's text turned into content and tool calls, delta by delta: what a stream sends
//! as `delta.content` and `delta.tool_calls`. A reply that does not stream runs the same
//! machine over its whole text at once, so the two always agree.

use serde_json::{json, Value};

use super::parse::CallFormat;

/// A finished tool call, as OpenAI's `message.tool_calls[]` holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// What one delta of text adds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamDelta {
    pub content: String,
    /// OpenAI's `delta.tool_calls[]` entries: the first of a call has its `id`, `type` and
    /// name, the rest more of its `arguments`.
    pub tool_calls: Vec<Value>,
}

#[derive(Debug, Clone, Default)]
struct SentCall {
    name: Option<String>,
    arguments: String,
    done: bool,
    invalid: bool,
}

/// The tool-call reading of one choice's text.
#[derive(Debug, Clone)]
pub struct ToolStream {
    format: CallFormat,
    /// `parallel_tool_calls: false` keeps only the first call.
    parallel: bool,
    /// Call ids are this plus the call's index.
    id_prefix: String,
    text: String,
    content_sent: usize,
    calls: Vec<SentCall>,
}

impl ToolStream {
    pub fn new(format: CallFormat, parallel: bool, id_prefix: String) -> Self {
        ToolStream {
            format,
            parallel,
            id_prefix,
            text: String::new(),
            content_sent: 0,
            calls: Vec::new(),
        }
    }

    fn call_id(&self, index: usize) -> String {
        format!("{}{index}", self.id_prefix)
    }

    /// Takes the next piece of text (`finished`: the last) and says what it settles.
    pub fn push(&mut self, text: &str, finished: bool) -> StreamDelta {
        self.text.push_str(text);
        let segments = self.format.segments(&self.text, finished);
        let mut delta = StreamDelta::default();
        if segments.content_end > self.content_sent {
            if let Some(c) = self.text.get(self.content_sent..segments.content_end) {
                delta.content = c.to_string();
                self.content_sent = segments.content_end;
            }
        }
        let limit = if self.parallel { usize::MAX } else { 1 };
        for (index, span) in segments.calls.iter().enumerate().take(limit) {
            if self.calls.len() <= index {
                self.calls.push(SentCall::default());
            }
            if self.calls[index].done {
                continue;
            }
            let read = self.format.read_call(&self.text, span);
            let id = self.call_id(index);
            let sent = &mut self.calls[index];
            if read.invalid {
                (sent.done, sent.invalid) = (true, true);
                continue;
            }
            let mut entry = json!({"index": index});
            let mut function = serde_json::Map::new();
            if sent.name.is_none() {
                let Some(name) = read.name else { continue };
                entry["id"] = json!(id);
                entry["type"] = json!("function");
                function.insert("name".into(), json!(name));
                function.insert("arguments".into(), json!(""));
                sent.name = Some(name);
            }
            // Only text the arguments already had is ever sent again as their start.
            if let Some(more) = read
                .arguments
                .strip_prefix(sent.arguments.as_str())
                .filter(|m| !m.is_empty())
            {
                function.insert("arguments".into(), json!(more));
                sent.arguments.push_str(more);
            }
            sent.done = read.complete;
            if !function.is_empty() {
                entry["function"] = Value::Object(function);
                delta.tool_calls.push(entry);
            }
        }
        // Text that looked like a call but never named one is content after all, as in the
        // reply that does not stream.
        if finished && self.calls.iter().all(|c| c.name.is_none()) {
            if let Some(rest) = self.text.get(self.content_sent..) {
                delta.content.push_str(rest);
                self.content_sent = self.text.len();
            }
        }
        delta
    }

    /// The calls made so far that parsed.
    pub fn calls(&self) -> Vec<ToolCall> {
        self.calls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.done && !c.invalid)
            .filter_map(|(i, c)| {
                Some(ToolCall {
                    id: self.call_id(i),
                    name: c.name.clone()?,
                    arguments: c.arguments.clone(),
                })
            })
            .collect()
    }

    /// OpenAI's finish reason once the text ended for `reason` (`stop` or `length`): a reply
    /// that made calls of its own accord ends with `tool_calls`; a named function, as at
    /// OpenAI, with `stop`.
    pub fn finish_reason(&self, reason: &'static str) -> &'static str {
        let chose = !matches!(self.format, CallFormat::Arguments(_));
        let called = self.calls.iter().any(|c| c.done && !c.invalid);
        if reason == "stop" && chose && called {
            "tool_calls"
        } else {
            reason
        }
    }

    /// A whole text read at once: the message's content (`None` when calls were made and
    /// nothing else was said) and its calls. A text whose calls do not parse is all content,
    /// as vLLM answers it.
    pub fn complete(mut self, text: &str) -> (Option<String>, Vec<ToolCall>, Self) {
        let delta = self.push(text, true);
        let calls = self.calls();
        let content = if calls.is_empty() {
            Some(self.text.clone())
        } else {
            Some(delta.content).filter(|c| !c.trim().is_empty())
        };
        (content, calls, self)
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
