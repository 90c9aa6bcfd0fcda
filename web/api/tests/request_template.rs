//! A request's own `chat_template` (vLLM's `--trust-request-chat-template`): refused by
//! default, rendered when the server trusts requests, with the same bounds as the model's and
//! its errors naming `chat_template`.

use infer_api::prepare::{ChatLimits, Served};
use infer_api::ChatRequest;
use infer_core::Tokenizer;
use serde_json::{json, Value};

const PLAIN: &str = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}\
{% if add_generation_prompt %}[assistant] {% endif %}";

fn tokenizer() -> Tokenizer {
    infer_core::open_model(&infer_tests::smollm2_path())
        .expect("SmolLM2")
        .tokenizer
}

fn request(template: &str, extra: Value) -> ChatRequest {
    let mut body = json!({
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "chat_template": template,
    });
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    serde_json::from_value(body).unwrap()
}

fn served(tok: &Tokenizer, trusted: bool) -> Served<'_> {
    Served {
        tokenizer: tok,
        model_name: "smol",
        aliases: &[],
        max_model_len: 2048,
        tool_parser: None,
        limits: ChatLimits {
            request_templates: trusted,
            ..ChatLimits::default()
        },
        defaults: infer_api::defaults::RequestDefaults::none(),
    }
}

#[test]
fn a_request_template_is_refused_unless_the_server_trusts_requests() {
    let tok = tokenizer();
    let e = served(&tok, false)
        .chat(&request(PLAIN, json!({})))
        .err()
        .unwrap();
    assert_eq!(e.param.as_deref(), Some("chat_template"));
    assert!(e.message.contains("--trust-request-chat-template"), "{e}");
}

#[test]
fn a_trusted_request_template_renders_the_prompt() {
    let tok = tokenizer();
    let s = served(&tok, true);
    let prompt = s.chat(&request(PLAIN, json!({}))).unwrap().prompt;
    assert_eq!(
        tok.decode(&prompt, false).unwrap(),
        "[system] Be brief.\n[user] Hi\n[assistant] "
    );
    // Without one, the model's own template (SmolLM2's ChatML) still renders.
    let mut plain = request(PLAIN, json!({}));
    plain.chat_template = None;
    let own = tok.decode(&s.chat(&plain).unwrap().prompt, false).unwrap();
    assert!(own.contains("<|im_start|>user\nHi"), "{own}");
    // The request's kwargs reach its template.
    let kw = "{{ greeting }} {{ messages[-1].content }}";
    let got = s
        .chat(&request(
            kw,
            json!({"chat_template_kwargs": {"greeting": "Hello"}}),
        ))
        .unwrap()
        .prompt;
    assert_eq!(tok.decode(&got, false).unwrap(), "Hello Hi");
}

#[test]
fn a_bad_request_template_names_the_field() {
    let tok = tokenizer();
    let s = served(&tok, true);
    let huge = "x".repeat(300 << 10);
    for template in [
        "{% for m in messages %}",                      // does not parse
        "{% for i in range(100000000) %}x{% endfor %}", // runs out of its budget
        "{{ raise_exception('no') }}",                  // raises
        huge.as_str(),                                  // too large
    ] {
        let e = s.chat(&request(template, json!({}))).err().unwrap();
        assert_eq!(e.status, 400, "{e}");
        assert_eq!(e.param.as_deref(), Some("chat_template"), "{e}");
    }
}
