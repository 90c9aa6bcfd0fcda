//! Where tool calls are in a model's text, for the formats models are trained to write
//! (vLLM's tool parsers) and the JSON that `tool_choice` `required` / a named function
//! constrains the output to. Works on partial text too: a stream asks again after every
//! delta, and only what can no longer change is reported as settled.

use std::ops::Range;

use serde_json::Value;

/// How a model writes tool calls in its text (vLLM's `--tool-call-parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallParser {
    /// Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, after
    /// optional prose.
    Hermes,
    /// Llama 3.x: the reply is `{"name": ..., "parameters": {...}}` (optionally after
    /// `<|python_tag|>`), several separated by `;`.
    Llama3Json,
}

impl ToolCallParser {
    pub const NAMES: &'static [&'static str] = &["hermes", "llama3_json"];

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "hermes" => Some(Self::Hermes),
            "llama3_json" => Some(Self::Llama3Json),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
        }
    }

    /// The parser a chat template's own tool format needs. A template that does not show the
    /// model its tools gets Hermes: infer then writes the tools and past calls into the
    /// prompt in Hermes's format. `None` for a template whose format no parser here reads.
    pub fn detect(template: Option<&str>) -> Option<Self> {
        let t = template?;
        if t.contains("<tool_call>") {
            Some(Self::Hermes)
        } else if t.contains("<|python_tag|>") || t.contains("ipython") {
            Some(Self::Llama3Json)
        } else if !infer_core::template_takes_tools(t) {
            Some(Self::Hermes)
        } else {
            None
        }
    }
}

/// What the generated text is, as far as tool calls go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFormat {
    /// Prose and calls in a parser's format (`tool_choice` `auto`).
    Parsed(ToolCallParser),
    /// A JSON array of `{"name", "parameters"}` (`tool_choice` `required`).
    Array,
    /// The arguments of this one function (`tool_choice` names it).
    Arguments(String),
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

/// One call's text: `body` is its JSON (partial while `closed` is false).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSpan {
    pub body: Range<usize>,
    pub closed: bool,
}

/// Where content and calls are. Content is always a prefix of the text; `content_end` is
/// where the settled part of it ends.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Segments {
    pub content_end: usize,
    pub calls: Vec<CallSpan>,
}

/// The length of the longest suffix of `text` that `tag` starts with (a tag still arriving).
fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

/// The byte offset of the first non-whitespace character at or after `from`.
fn skip_ws(text: &str, from: usize) -> usize {
    text[from..]
        .find(|c: char| !c.is_whitespace())
        .map_or(text.len(), |i| from + i)
}

impl CallFormat {
    /// Content and calls in `text`; `finished` says no more text comes.
    pub fn segments(&self, text: &str, finished: bool) -> Segments {
        match self {
            CallFormat::Parsed(ToolCallParser::Hermes) => hermes(text, finished),
            CallFormat::Parsed(ToolCallParser::Llama3Json) => llama3(text, finished),
            CallFormat::Array => array(text, finished),
            CallFormat::Arguments(_) => Segments {
                content_end: 0,
                calls: vec![CallSpan {
                    body: 0..text.len(),
                    closed: finished,
                }],
            },
        }
    }
}

fn hermes(text: &str, finished: bool) -> Segments {
    let Some(first) = text.find(HERMES_OPEN) else {
        let content_end = if finished {
            text.len()
        } else {
            let settled = &text[..text.len() - partial_tag(text, HERMES_OPEN)];
            // Whitespace before a call is not content: wait to see what follows it.
            settled.trim_end().len()
        };
        return Segments {
            content_end,
            calls: Vec::new(),
        };
    };
    let mut calls = Vec::new();
    let mut open = Some(first);
    while let Some(at) = open {
        let start = at + HERMES_OPEN.len();
        match text[start..].find(HERMES_CLOSE) {
            Some(len) => {
                calls.push(CallSpan {
                    body: start..start + len,
                    closed: true,
                });
                let next = start + len + HERMES_CLOSE.len();
                open = text[next..].find(HERMES_OPEN).map(|i| next + i);
            }
            None => {
                let end = if finished {
                    text.len()
                } else {
                    text.len() - partial_tag(&text[start..], HERMES_CLOSE)
                };
                calls.push(CallSpan {
                    body: start..end,
                    closed: finished,
                });
                open = None;
            }
        }
    }
    Segments {
        content_end: text[..first].trim_end().len(),
        calls,
    }
}

/// One JSON value starting at `from`: its end, or `None` while it is incomplete. A syntax
/// error ends the value where the text ends (it fails to parse as a call).
fn json_value_end(text: &str, from: usize) -> Option<usize> {
    let mut values = serde_json::Deserializer::from_str(&text[from..]).into_iter::<Value>();
    match values.next() {
        Some(Ok(_)) => Some(from + values.byte_offset()),
        Some(Err(e)) if e.is_eof() => None,
        _ => Some(text.len()),
    }
}

/// JSON objects from `from`, separated by `sep`, until the text or the objects end.
fn json_objects(text: &str, mut from: usize, sep: char, finished: bool) -> Vec<CallSpan> {
    let mut calls = Vec::new();
    loop {
        match json_value_end(text, from) {
            Some(end) => {
                calls.push(CallSpan {
                    body: from..end,
                    closed: true,
                });
                let next = skip_ws(text, end);
                if !text[next..].starts_with(sep) {
                    return calls;
                }
                from = skip_ws(text, next + sep.len_utf8());
                if !text[from..].starts_with('{') {
                    return calls;
                }
            }
            None => {
                calls.push(CallSpan {
                    body: from..text.len(),
                    closed: finished,
                });
                return calls;
            }
        }
    }
}

fn llama3(text: &str, finished: bool) -> Segments {
    let mut at = skip_ws(text, 0);
    if text[at..].starts_with(PYTHON_TAG) {
        at = skip_ws(text, at + PYTHON_TAG.len());
    }
    let rest = &text[at..];
    if rest.starts_with('{') {
        return Segments {
            content_end: 0,
            calls: json_objects(text, at, ';', finished),
        };
    }
    // Not a call (yet): all content, unless the text may still become one.
    let undecided = !finished && (rest.is_empty() || PYTHON_TAG.starts_with(rest));
    Segments {
        content_end: if undecided { 0 } else { text.len() },
        calls: Vec::new(),
    }
}

fn array(text: &str, finished: bool) -> Segments {
    let at = skip_ws(text, 0);
    let calls = if text[at..].starts_with('[') {
        let first = skip_ws(text, at + 1);
        if text[first..].starts_with('{') {
            json_objects(text, first, ',', finished)
        } else {
            Vec::new()
        }
    } else {
        Vec::new()
    };
    Segments {
        content_end: 0,
        calls,
    }
}

/// A call read from its span: the name once known, and its arguments so far (only text that
/// the finished arguments will start with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallText {
    pub name: Option<String>,
    pub arguments: String,
    /// Closed and well formed: `arguments` is final.
    pub complete: bool,
    /// Closed but not a call (bad JSON, no name): report nothing more of it.
    pub invalid: bool,
}

/// `{"name": "...", "arguments": ` at the start of `body`: the name and where the arguments
/// start (`None` until the text gets that far).
fn name_then_arguments(body: &str) -> (Option<String>, Option<usize>) {
    let mut at = skip_ws(body, 0);
    let expect = |at: &mut usize, s: &str| -> bool {
        *at = skip_ws(body, *at);
        if body[*at..].starts_with(s) {
            *at += s.len();
            true
        } else {
            false
        }
    };
    if !(expect(&mut at, "{") && expect(&mut at, "\"name\"") && expect(&mut at, ":")) {
        return (None, None);
    }
    at = skip_ws(body, at);
    let Some(end) = json_value_end(body, at) else {
        return (None, None);
    };
    let Ok(Value::String(name)) = serde_json::from_str::<Value>(&body[at..end]) else {
        return (None, None);
    };
    at = end;
    let args = expect(&mut at, ",")
        && (expect(&mut at, "\"arguments\"") || expect(&mut at, "\"parameters\""))
        && expect(&mut at, ":");
    (Some(name), args.then(|| skip_ws(body, at)))
}

impl CallFormat {
    /// The call in `span` of `text`.
    pub fn read_call(&self, text: &str, span: &CallSpan) -> CallText {
        let body = &text[span.body.clone()];
        if let CallFormat::Arguments(name) = self {
            let arguments = body.trim();
            let invalid =
                span.closed && !matches!(serde_json::from_str(arguments), Ok(Value::Object(_)));
            return CallText {
                name: Some(name.clone()),
                arguments: arguments.to_string(),
                complete: span.closed && !invalid,
                invalid,
            };
        }
        let (name, args_at) = name_then_arguments(body);
        if span.closed {
            return match whole_call(body, args_at) {
                Some((name, arguments)) => CallText {
                    name: Some(name),
                    arguments,
                    complete: true,
                    invalid: false,
                },
                None => CallText {
                    name,
                    arguments: String::new(),
                    complete: false,
                    invalid: true,
                },
            };
        }
        // Still arriving: the arguments' text so far, holding back closing braces and
        // whitespace (the last brace closes the call, not the arguments).
        let arguments = args_at.map_or("", |at| {
            body[at..].trim_end_matches(|c: char| c == '}' || c.is_whitespace())
        });
        CallText {
            name,
            arguments: arguments.to_string(),
            complete: false,
            invalid: false,
        }
    }
}

/// A closed call's name and arguments. The arguments are the model's own text when the
/// name came first (so a stream could send them as they arrived), else the value re-encoded.
fn whole_call(body: &str, args_at: Option<usize>) -> Option<(String, String)> {
    let Value::Object(call) = serde_json::from_str::<Value>(body.trim()).ok()? else {
        return None;
    };
    let name = call.get("name")?.as_str()?.to_string();
    let value = call
        .get("arguments")
        .or_else(|| call.get("parameters"))
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    let raw = args_at.and_then(|at| {
        let close = body.trim_end().strip_suffix('}')?;
        close.get(at..).map(str::trim_end)
    });
    let arguments = match raw {
        Some(raw) if serde_json::from_str::<Value>(raw).ok().as_ref() == Some(&value) => {
            raw.to_string()
        }
        _ => value.to_string(),
    };
    Some((name, arguments))
}
