//! Tools in the prompt of a model whose chat template does not take them (SmolLM2's, many
//! base ChatML ones): the tools are written into the system message, past calls into the
//! assistant's text and tool results into user turns, in the format the tool-call parser
//! reads back, so the model sees what a template with tool support would show it.

use infer_core::ChatMessage;
use serde_json::Value;

use super::parse::ToolCallParser;

fn hermes_preamble(tools: &[Value]) -> String {
    let listed: Vec<String> = tools.iter().map(Value::to_string).collect();
    format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n\
         <tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
        listed.join("\n")
    )
}

fn llama3_preamble(tools: &[Value]) -> String {
    let listed: Vec<String> = tools.iter().map(Value::to_string).collect();
    format!(
        "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n\
         Respond in the format {{\"name\": function name, \"parameters\": dictionary of argument name and its value}}. Do not use variables.\n\n{}",
        listed.join("\n\n")
    )
}

/// A past call as the model would have written it.
fn written_call(parser: ToolCallParser, call: &Value) -> String {
    let f = &call["function"];
    // Name first, as the models write it (a JSON map would sort the keys).
    let (name, args) = (&f["name"], &f["arguments"]);
    match parser {
        ToolCallParser::Hermes => {
            format!("<tool_call>\n{{\"name\": {name}, \"arguments\": {args}}}\n</tool_call>")
        }
        ToolCallParser::Llama3Json => format!("{{\"name\": {name}, \"parameters\": {args}}}"),
    }
}

/// `messages` with `tools` (a list; `None`: none shown) and the tool fields written into the
/// text, for a template that does not read them.
pub fn write_into_messages(
    mut messages: Vec<ChatMessage>,
    tools: Option<&Value>,
    parser: ToolCallParser,
) -> Vec<ChatMessage> {
    for m in &mut messages {
        if let Some(calls) = m.tool_calls.take() {
            let sep = match parser {
                ToolCallParser::Hermes => "\n",
                ToolCallParser::Llama3Json => "; ",
            };
            let written: Vec<String> = calls.iter().map(|c| written_call(parser, c)).collect();
            let calls = written.join(sep);
            m.content = if m.content.is_empty() {
                calls
            } else {
                format!("{}\n{calls}", m.content)
            };
        }
        if m.role == "tool" {
            m.role = "user".into();
            m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
            m.tool_call_id = None;
        }
    }
    let Some(Value::Array(tools)) = tools else {
        return messages;
    };
    if tools.is_empty() {
        return messages;
    }
    let preamble = match parser {
        ToolCallParser::Hermes => hermes_preamble(tools),
        ToolCallParser::Llama3Json => llama3_preamble(tools),
    };
    match messages.first_mut() {
        Some(first) if first.role == "system" => {
            first.content = format!("{}\n\n{preamble}", first.content);
        }
        _ => messages.insert(0, ChatMessage::new("system", preamble)),
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tools_calls_and_results_are_written_in_hermes_format() {
        let call = json!({"id": "c0", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}});
        let messages = vec![
            ChatMessage::user("Weather in Paris?"),
            ChatMessage {
                role: "assistant".into(),
                content: String::new(),
                tool_calls: Some(vec![call]),
                tool_call_id: None,
            },
            ChatMessage {
                role: "tool".into(),
                content: "18C".into(),
                tool_calls: None,
                tool_call_id: Some("c0".into()),
            },
        ];
        let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let out = write_into_messages(messages, Some(&tools), ToolCallParser::Hermes);
        assert_eq!(out[0].role, "system");
        let listed = out[0].content.split("<tools>\n").nth(1).unwrap_or_default();
        let first: Value = serde_json::from_str(listed.lines().next().unwrap_or_default()).unwrap();
        assert_eq!(first, tools[0]);
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"
        );
        assert_eq!(
            (out[3].role.as_str(), out[3].content.as_str()),
            ("user", "<tool_response>\n18C\n</tool_response>")
        );
    }
}
