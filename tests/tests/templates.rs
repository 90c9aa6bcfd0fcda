//! Real chat templates of the families we run (Qwen3, Phi-3.5, Gemma 2; fixtures/templates/)
//! rendered byte for byte as transformers renders them (`scripts/template_references.py`):
//! thinking switched off through `chat_template_kwargs`, tools and tool turns, and a template
//! that raises (Gemma 2 refuses a system message) failing with its own message.

use infer_core::tokenizer::render_chat_template;
use infer_core::ChatMessage;
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    name: String,
    template: String,
    messages: Vec<serde_json::Value>,
    tools: Option<serde_json::Value>,
    kwargs: serde_json::Map<String, serde_json::Value>,
    bos_token: String,
    eos_token: String,
    add_generation_prompt: bool,
    rendered: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

fn message(v: &serde_json::Value) -> ChatMessage {
    ChatMessage {
        role: v["role"].as_str().unwrap().into(),
        content: v["content"].as_str().unwrap_or_default().into(),
        tool_calls: v["tool_calls"].as_array().cloned(),
        tool_call_id: v["tool_call_id"].as_str().map(String::from),
    }
}

#[test]
fn family_chat_templates_render_as_transformers_renders_them() {
    let dir = infer_tests::fixtures_dir().join("templates");
    let text = std::fs::read_to_string(dir.join("cases.json")).unwrap();
    let fixture: Fixture = serde_json::from_str(&text).unwrap();
    assert!(fixture.cases.len() >= 8);
    for case in fixture.cases {
        let template = std::fs::read_to_string(dir.join(&case.template)).unwrap();
        let messages: Vec<ChatMessage> = case.messages.iter().map(message).collect();
        let got = render_chat_template(
            &template,
            &messages,
            case.tools.as_ref(),
            Some(&case.kwargs),
            case.add_generation_prompt,
            &case.bos_token,
            &case.eos_token,
        );
        match (&case.rendered, &case.error) {
            (Some(want), _) => assert_eq!(&got.unwrap(), want, "{}", case.name),
            (None, Some(want)) => {
                let e = got.unwrap_err().to_string();
                assert!(e.contains(want.as_str()), "{}: {e}", case.name);
            }
            (None, None) => panic!("{}: the fixture has neither rendering nor error", case.name),
        }
    }
}
