//! Tool requests turned into prompts with SmolLM2's tokenizer: through a template that takes
//! `tools` (written here in the style of HF's tool templates), and through SmolLM2's own,
//! which does not (tools, past calls and results written into the messages).

use infer_api::prepare::Served;
use infer_api::tools::{CallFormat, ToolCallParser};
use infer_api::ChatRequest;
use infer_core::sampling::StructuredOutput;
use infer_core::Tokenizer;
use serde_json::{json, Value};

/// HF-style: `tools` listed in a system turn, calls as `<tool_call>` JSON with their
/// arguments as objects, tool results with their call's id.
const TOOL_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
Tools:
{%- for t in tools %}
{{ t | tojson }}
{%- endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.tool_calls is defined %}<|im_start|>assistant
{%- for c in m.tool_calls %}
<tool_call>{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == "tool" %}<|im_start|>tool {{ m.tool_call_id }}
{{ m.content }}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

fn smollm2_tokenizer() -> Tokenizer {
    infer_core::open_model(&infer_tests::smollm2_path())
        .expect("SmolLM2")
        .tokenizer
}

fn request(extra: Value) -> ChatRequest {
    let mut body = json!({
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "description": "Weather now", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    });
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    serde_json::from_value(body).unwrap()
}

fn prompt_text(tok: &Tokenizer, parser: Option<ToolCallParser>, req: &ChatRequest) -> String {
    let served = Served {
        tokenizer: tok,
        model_name: "smol",
        aliases: &[],
        max_model_len: 2048,
        tool_parser: parser,
        limits: Default::default(),
        defaults: infer_api::defaults::RequestDefaults::none(),
    };
    let prepared = served.chat(req).unwrap();
    tok.decode(&prepared.prompt, false).unwrap()
}

#[test]
fn a_template_that_takes_tools_gets_them_and_past_calls_as_objects() {
    let tok = smollm2_tokenizer()
        .with_chat_template(TOOL_TEMPLATE.into())
        .unwrap();
    assert_eq!(
        ToolCallParser::detect(tok.chat_template()),
        Some(ToolCallParser::Hermes)
    );
    let text = prompt_text(&tok, Some(ToolCallParser::Hermes), &request(json!({})));
    // Keys in the order given, with Python's separators, as transformers renders them.
    assert!(
        text.contains("Tools:\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", \"parameters\": {\"type\": \"object\""),
        "{text}"
    );
    assert!(
        text.contains("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>"),
        "{text}"
    );
    assert!(
        text.contains("<|im_start|>tool call_1\n18C and sunny"),
        "{text}"
    );
    // tool_choice "none": the tools stay out of the prompt.
    let none = prompt_text(&tok, None, &request(json!({"tool_choice": "none"})));
    assert!(!none.contains("Tools:"), "{none}");
}

#[test]
fn smollm2s_template_gets_tools_written_into_the_messages() {
    let tok = smollm2_tokenizer();
    assert_eq!(
        ToolCallParser::detect(tok.chat_template()),
        Some(ToolCallParser::Hermes)
    );
    let text = prompt_text(&tok, Some(ToolCallParser::Hermes), &request(json!({})));
    assert!(text.starts_with("<|im_start|>system\n# Tools\n"), "{text}");
    assert!(text.contains("<tools>\n{"), "{text}");
    assert!(
        text.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call><|im_end|>"),
        "{text}"
    );
    assert!(
        text.contains(
            "<|im_start|>user\n<tool_response>\n18C and sunny\n</tool_response><|im_end|>"
        ),
        "{text}"
    );
}

#[test]
fn required_and_named_choices_constrain_the_output() {
    let tok = smollm2_tokenizer();
    let served = Served {
        tokenizer: &tok,
        model_name: "smol",
        aliases: &[],
        max_model_len: 2048,
        tool_parser: None,
        limits: Default::default(),
        defaults: infer_api::defaults::RequestDefaults::none(),
    };
    let p = served
        .chat(&request(json!({"tool_choice": "required"})))
        .unwrap();
    assert_eq!(p.tools.unwrap().format, CallFormat::Array);
    assert!(matches!(
        p.params.structured_outputs,
        Some(StructuredOutput::Json(_))
    ));
    assert_eq!(p.structured_param, Some("tools"));
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let p = served.chat(&request(named)).unwrap();
    assert_eq!(
        p.tools.unwrap().format,
        CallFormat::Arguments("get_weather".into())
    );
    // Auto needs a parser; a grammar of its own cannot join a forced call.
    let e = served.chat(&request(json!({}))).err().unwrap();
    assert_eq!(e.param.as_deref(), Some("tool_choice"));
    let both = json!({"tool_choice": "required", "response_format": {"type": "json_object"}});
    let e = served.chat(&request(both)).err().unwrap();
    assert_eq!(e.param.as_deref(), Some("tool_choice"));
    // Bad arguments in a past call are named by position.
    let mut bad = request(json!({}));
    bad.messages[1].tool_calls.as_mut().unwrap()[0]
        .function
        .arguments = "{city".into();
    let served = Served {
        tool_parser: Some(ToolCallParser::Hermes),
        ..served
    };
    let e = served.chat(&bad).err().unwrap();
    assert_eq!(
        e.param.as_deref(),
        Some("messages[1].tool_calls[0].function.arguments")
    );
}
