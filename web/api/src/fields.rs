//! The checks every request body gets beyond its types: fields we do not implement (a 400
//! naming them, never ignored), the structured-output constraint, and chat messages as the
//! template takes them (content parts joined, other part types refused by position).

use infer_core::{ChatMessage, SamplingParams};
use serde_json::{json, Value};

use crate::defaults::RequestDefaults;
use crate::error::RequestError;
use crate::types::{
    ChatMessageIn, ChatRequest, MessageContent, SamplingFields, StructuredFields, IGNORED_FIELDS,
};

/// A request body as `T`; a body that does not parse is a 400 whose `param` is the field at
/// fault (`messages[0].content`), where the error is in one, and whose message says what was
/// expected there.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, RequestError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = parsed.map_err(|e| {
        let mut path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." || path.contains('?') {
            path = flattened_field(bytes).unwrap_or_default();
        }
        let located = !path.is_empty();
        // serde's message ends with the byte position, which says nothing to a client
        // that names fields.
        let what = inner.to_string();
        let what = match what.rsplit_once(" at line ") {
            Some((w, _)) if located => w.to_string(),
            _ => what,
        };
        if located {
            RequestError::bad_request(format!("invalid `{path}`: {what}")).param(&path)
        } else {
            RequestError::bad_request(format!("invalid JSON body: {what}"))
        }
    })?;
    de.end()
        .map_err(|e| RequestError::bad_request(format!("invalid JSON body: {e}")))?;
    Ok(value)
}

/// The top-level field a type error is in when serde cannot say (fields of the flattened
/// sampling and structured-output groups): each field alone through those groups' types.
fn flattened_field(bytes: &[u8]) -> Option<String> {
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(bytes) else {
        return None;
    };
    body.into_iter().find_map(|(k, v)| {
        let alone = Value::Object([(k.clone(), v)].into_iter().collect());
        let bad = serde_json::from_value::<SamplingFields>(alone.clone()).is_err()
            || serde_json::from_value::<StructuredFields>(alone).is_err();
        bad.then_some(k)
    })
}

/// SGLang fields its router (sglang-router / sgl-model-gateway) writes into every request it
/// forwards, at their defaults. Each is accepted only at the value that is what infer does
/// anyway (`None`: any boolean: whether reasoning is separated is the server's
/// --reasoning-parser); any other value is refused like an unknown field.
const ROUTER_DEFAULTS: &[(&str, Option<bool>)] = &[
    ("no_stop_trim", Some(false)),
    ("return_hidden_states", Some(false)),
    ("continue_final_message", Some(false)),
    ("separate_reasoning", None),
    ("stream_reasoning", None),
];

fn is_router_default(key: &str, value: &Value) -> bool {
    ROUTER_DEFAULTS.iter().any(|(k, want)| {
        *k == key
            && match (want, value) {
                (None, Value::Bool(_)) => true,
                (Some(w), Value::Bool(b)) => w == b,
                _ => false,
            }
    })
}

/// Fields refused with a reason of their own (they change the result, and infer does not do
/// what they ask); any other unknown field gets the generic refusal.
const REFUSED_FIELDS: &[(&str, &str)] = &[
    ("suffix", "insertion (fill-in-the-middle) is not supported"),
    (
        "functions",
        "use `tools` (OpenAI's replacement for `functions`)",
    ),
    (
        "function_call",
        "use `tool_choice` (OpenAI's replacement for `function_call`)",
    ),
    ("audio", "the served model takes and writes text only"),
    (
        "logits_processors",
        "custom logits processors cannot be loaded per request",
    ),
];

/// What the policy makes of an unknown field: a no-op (`Ok`), or the refusal's reason.
fn unknown_field(key: &str, value: &Value) -> Result<(), String> {
    if IGNORED_FIELDS.contains(&key) || is_router_default(key, value) || value.is_null() {
        return Ok(());
    }
    if key == "modalities" && value == &json!(["text"]) {
        return Ok(());
    }
    match REFUSED_FIELDS.iter().find(|(k, _)| *k == key) {
        Some((_, why)) => Err(format!("`{key}` is not supported: {why}")),
        None => Err(format!(
            "unsupported parameter `{key}`: infer does not implement it, and ignoring it would change what you asked for"
        )),
    }
}

/// The request-field policy (as vLLM, which warns about fields it ignores): a field with no
/// effect on the result (`IGNORED_FIELDS`, a null value, `modalities: ["text"]`, a router's
/// default) is accepted and logged at debug; any other unknown field is a 400 naming it (the
/// first in name order).
pub fn check_extra_fields(
    extra: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), RequestError> {
    let mut keys: Vec<&String> = extra.keys().collect();
    keys.sort();
    let mut ignored = Vec::new();
    for k in keys {
        match unknown_field(k, &extra[k]) {
            Ok(()) => ignored.push(k.as_str()),
            Err(why) => return Err(RequestError::bad_request(why).param(k)),
        }
    }
    if !ignored.is_empty() {
        tracing::debug!(fields = ?ignored, "request fields accepted with no effect on the result");
    }
    Ok(())
}

/// Shared by both endpoints: unknown fields, stream options that mean nothing as given, and
/// the structured-output constraint.
pub fn apply_common(
    extra: &serde_json::Map<String, serde_json::Value>,
    structured: &StructuredFields,
    sampling: &SamplingFields,
    params: &mut SamplingParams,
) -> Result<Option<&'static str>, RequestError> {
    check_extra_fields(extra)?;
    if sampling.stream_options.is_some() && !sampling.stream {
        return Err(
            RequestError::bad_request("`stream_options` needs `stream: true`")
                .param("stream_options"),
        );
    }
    if sampling
        .stream_options
        .as_ref()
        .is_some_and(|o| o.continuous_usage_stats && !o.include_usage)
    {
        return Err(RequestError::bad_request(
            "`continuous_usage_stats` needs `include_usage: true` (as in vLLM)",
        )
        .param("stream_options"));
    }
    let constraint = structured.constraint()?;
    Ok(constraint.map(|(spec, param)| {
        params.structured_outputs = Some(spec);
        param
    }))
}

/// Messages as the template takes them: text parts joined by newlines (as vLLM does); parts
/// of other types are refused, naming where they are.
pub fn chat_messages(messages: &[ChatMessageIn]) -> Result<Vec<ChatMessage>, RequestError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let content = match &m.content {
            None => String::new(),
            Some(MessageContent::Text(t)) => t.clone(),
            Some(MessageContent::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for (j, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => texts.push(t.as_str()),
                        ("text", None) => {
                            return Err(RequestError::bad_request("a text part has no `text`")
                                .param(&format!("messages[{i}].content[{j}].text")))
                        }
                        (kind, _) => {
                            return Err(RequestError::bad_request(format!(
                                "content parts of type `{kind}` are not supported: the served model takes text only"
                            ))
                            .param(&format!("messages[{i}].content[{j}].type")))
                        }
                    }
                }
                texts.join("\n")
            }
        };
        out.push(ChatMessage {
            role: m.role.clone(),
            content,
            tool_calls: past_calls(i, m)?,
            tool_call_id: m.tool_call_id.clone(),
        });
    }
    Ok(out)
}

/// An assistant's past calls as templates read them: arguments as a JSON object (HF
/// templates write `arguments | tojson`), not the string OpenAI carries them in.
fn past_calls(i: usize, m: &ChatMessageIn) -> Result<Option<Vec<Value>>, RequestError> {
    let Some(calls) = &m.tool_calls else {
        return Ok(None);
    };
    if m.role != "assistant" {
        return Err(RequestError::bad_request(format!(
            "only assistant messages carry `tool_calls`, not `{}`",
            m.role
        ))
        .param(&format!("messages[{i}].tool_calls")));
    }
    let mut out = Vec::with_capacity(calls.len());
    for (j, c) in calls.iter().enumerate() {
        let raw = c.function.arguments.trim();
        let arguments: Value = if raw.is_empty() {
            json!({})
        } else {
            serde_json::from_str(raw).map_err(|e| {
                RequestError::bad_request(format!("the arguments are not JSON: {e}"))
                    .param(&format!("messages[{i}].tool_calls[{j}].function.arguments"))
            })?
        };
        out.push(json!({
            "id": c.id,
            "type": c.kind.as_deref().unwrap_or("function"),
            "function": {"name": c.function.name, "arguments": arguments},
        }));
    }
    Ok(Some(out))
}

/// The template's extra variables: the server's defaults, vLLM's `documents` and
/// `reasoning_effort`, then the request's `chat_template_kwargs` (which win, as in vLLM).
pub(crate) fn template_kwargs(
    req: &ChatRequest,
    defaults: &RequestDefaults,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    let mut kwargs = defaults.chat_template_kwargs.clone();
    if let Some(d) = &req.documents {
        kwargs.insert("documents".into(), serde_json::json!(d));
    }
    if let Some(e) = &req.reasoning_effort {
        kwargs.insert("reasoning_effort".into(), e.clone().into());
    }
    kwargs.extend(req.chat_template_kwargs.clone().unwrap_or_default());
    (!kwargs.is_empty()).then_some(kwargs)
}

/// vLLM's chat `echo`: the last message's text, when the reply takes its role (the reply
/// continues it, or it is an assistant message before a new assistant turn).
pub(crate) fn echoed(req: &ChatRequest) -> Option<String> {
    let last = req.messages.last()?;
    let continues = req.continue_final_message || req.add_generation_prompt == Some(false);
    if !continues && last.role != "assistant" {
        return None;
    }
    let messages = chat_messages(std::slice::from_ref(last)).ok()?;
    messages.into_iter().next().map(|m| m.content)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extra(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn type_errors_name_the_field() {
        use crate::types::CompletionRequest;
        let err = parse_body::<CompletionRequest>(br#"{"prompt": "x", "max_tokens": "ten"}"#)
            .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("max_tokens"), "{err:?}");
        assert!(!err.message.contains("line 1"), "{err:?}");
        let err = parse_body::<ChatRequest>(
            br#"{"messages": [{"role": "user", "content": 5}], "temperature": 1}"#,
        )
        .unwrap_err();
        assert!(
            err.param
                .as_deref()
                .is_some_and(|p| p.starts_with("messages[0]")),
            "{err:?}"
        );
        let err = parse_body::<ChatRequest>(br#"{"messages": [], "n": -1}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("n"), "{err:?}");
        let err = parse_body::<ChatRequest>(b"{not json").unwrap_err();
        assert_eq!(err.param, None, "{err:?}");
    }

    #[test]
    fn router_defaults_pass_and_other_values_are_named() {
        let router = json!({"no_stop_trim": false, "return_hidden_states": false,
            "continue_final_message": false, "separate_reasoning": true, "stream_reasoning": true});
        assert!(check_extra_fields(&extra(router)).is_ok());
        for (k, v) in [
            ("no_stop_trim", json!(true)),
            ("return_hidden_states", json!(true)),
            ("separate_reasoning", json!("yes")),
        ] {
            let err = check_extra_fields(&extra(json!({ k: v }))).unwrap_err();
            assert!(format!("{err:?}").contains(k), "{err:?}");
        }
    }
}
