//! vLLM's request fields over HTTP, table by table: each is honoured (and its effect is
//! checked against the same request without it), accepted as a no-op by the documented
//! policy, or refused with a 400 naming it. `stop_reason` comes back as vLLM's.

mod common;

use common::post;
use serde_json::{json, Value};

fn completion(extra: Value) -> Value {
    let mut body = json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn text(v: &Value) -> String {
    let c = &v["choices"][0];
    c["text"]
        .as_str()
        .or(c["message"]["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Fields with no effect on the result: accepted on both endpoints.
#[test]
fn no_op_fields_are_accepted_by_policy() {
    for (field, value) in [
        ("user", json!("u-1")),
        ("store", json!(false)),
        ("metadata", json!({"k": "v"})),
        ("service_tier", json!("auto")),
        ("prediction", json!({"type": "content", "content": "Paris"})),
        ("spaces_between_special_tokens", json!(false)),
        ("audio", json!(null)),
        ("web_search_options", json!(null)),
        ("modalities", json!(["text"])),
        ("priority", json!(0)),
        ("guided_decoding_backend", json!("guidance")),
    ] {
        for (path, body) in [
            ("/v1/completions", completion(json!({ field: value }))),
            ("/v1/chat/completions", chat(json!({ field: value }))),
        ] {
            let (status, v) = post(path, &body);
            assert_eq!(status, 200, "{path} {field}: {v}");
        }
    }
}

/// `cache_salt`: a prompt's cached blocks serve only requests with the same salt, on both
/// endpoints; an empty salt is refused by name.
#[test]
fn cache_salt_partitions_the_prefix_cache() {
    // Long enough for several full 16-token blocks, and unlike any other test's prompt.
    let prompt = "Salted caches: a tenant's prompt blocks are shared with requests carrying \
                  the same salt and no others, so the time to first token says nothing about \
                  what other tenants have asked the server before this request arrived.";
    let cached = |salt: Value| {
        let mut body = json!({"prompt": prompt, "max_tokens": 1});
        if !salt.is_null() {
            body["cache_salt"] = salt;
        }
        let (status, v) = post("/v1/completions", &body);
        assert_eq!(status, 200, "{v}");
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached(json!("tenant-a")), 0);
    assert_eq!(
        cached(Value::Null),
        0,
        "an unsalted request hit a salted prompt"
    );
    assert_eq!(
        cached(json!("tenant-b")),
        0,
        "another salt hit tenant-a's prompt"
    );
    assert!(cached(json!("tenant-a")) >= 16, "the same salt missed");
    assert!(cached(Value::Null) >= 16, "the unsalted chain missed");
    let messages = json!([{"role": "user", "content": prompt}]);
    let chat_cached = |salt: &str| {
        let body = json!({"messages": messages, "max_tokens": 1, "cache_salt": salt});
        let (status, v) = post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(chat_cached("tenant-c"), 0);
    assert!(chat_cached("tenant-c") >= 16);
    let (status, v) = post("/v1/completions", &completion(json!({"cache_salt": ""})));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "cache_salt", "{v}");
}

/// Fields that would change the result but are not supported: a 400 naming them.
#[test]
fn unsupported_fields_are_refused_by_name() {
    for (path, field, value) in [
        ("/v1/completions", "suffix", json!(" end")),
        (
            "/v1/chat/completions",
            "chat_template",
            json!("{{ messages }}"),
        ),
        ("/v1/chat/completions", "audio", json!({"voice": "alloy"})),
        (
            "/v1/chat/completions",
            "modalities",
            json!(["text", "audio"]),
        ),
        ("/v1/chat/completions", "functions", json!([{"name": "f"}])),
        ("/v1/chat/completions", "priority", json!(3)),
        ("/v1/chat/completions", "truncate_prompt_tokens", json!(0)),
        ("/v1/completions", "made_up_field", json!(1)),
    ] {
        let body = if path.contains("chat") {
            chat(json!({ field: value }))
        } else {
            completion(json!({ field: value }))
        };
        let (status, v) = post(path, &body);
        assert_eq!(status, 400, "{field}: {v}");
        assert_eq!(v["error"]["param"], field, "{v}");
    }
}

#[test]
fn honoured_fields_change_the_output() {
    let (_, base) = post("/v1/completions", &completion(json!({})));
    let base_text = text(&base);
    assert!(base_text.contains("Paris"), "{base}");

    // bad_words: the word is gone.
    let (_, v) = post(
        "/v1/completions",
        &completion(json!({"bad_words": ["Paris"]})),
    );
    assert!(!text(&v).contains("Paris"), "{v}");

    // allowed_token_ids: every generated token is one of them.
    let (_, t) = post(
        "/tokenize",
        &json!({"prompt": " yes no", "add_special_tokens": false}),
    );
    let allowed: Vec<u64> = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let (_, v) = post(
        "/v1/completions",
        &completion(json!({"allowed_token_ids": allowed, "logprobs": 0, "ignore_eos": true})),
    );
    let text_out = text(&v);
    assert!(
        text_out.split_whitespace().all(|w| w == "yes" || w == "no"),
        "{v}"
    );

    // stop with include_stop_str_in_output: the text ends with the stop string, and
    // stop_reason is the string itself (vLLM's), on both endpoints.
    let (_, v) = post(
        "/v1/completions",
        &completion(json!({"stop": ["Paris"], "include_stop_str_in_output": true})),
    );
    assert!(text(&v).ends_with("Paris"), "{v}");
    assert_eq!(v["choices"][0]["stop_reason"], "Paris", "{v}");
    let (_, v) = post("/v1/completions", &completion(json!({"stop": ["Paris"]})));
    assert!(!text(&v).contains("Paris"), "{v}");
    assert_eq!(v["choices"][0]["stop_reason"], "Paris", "{v}");
    let (_, v) = post("/v1/chat/completions", &chat(json!({"stop": ["Paris"]})));
    assert_eq!(v["choices"][0]["stop_reason"], "Paris", "{v}");
    // A stop token id comes back as the number; EOS and length as null.
    let (_, t) = post(
        "/tokenize",
        &json!({"prompt": base_text, "add_special_tokens": false}),
    );
    let first = t["tokens"][0].clone();
    let (_, v) = post(
        "/v1/completions",
        &completion(json!({"stop_token_ids": [first]})),
    );
    assert_eq!(v["choices"][0]["stop_reason"], first, "{v}");
    assert_eq!(base["choices"][0]["stop_reason"], Value::Null, "{base}");

    // truncate_prompt_tokens: only the prompt's last tokens are read.
    let (_, v) = post(
        "/v1/completions",
        &completion(json!({"truncate_prompt_tokens": 2})),
    );
    assert_eq!(v["usage"]["prompt_tokens"], 2, "{v}");

    // request_id names the reply.
    let (_, v) = post(
        "/v1/chat/completions",
        &chat(json!({"request_id": "abc-123"})),
    );
    assert_eq!(v["id"], "chatcmpl-abc-123", "{v}");

    // use_beam_search: n beams, deterministic, the best first.
    let (status, v) = post(
        "/v1/completions",
        &completion(json!({"use_beam_search": true, "n": 2, "temperature": null})),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2, "{v}");

    // add_special_tokens: false drops the BOS a completion prompt gets (when it has one).
    let (_, with) = post("/v1/completions", &completion(json!({})));
    let (_, without) = post(
        "/v1/completions",
        &completion(json!({"add_special_tokens": false})),
    );
    assert!(
        without["usage"]["prompt_tokens"].as_u64() <= with["usage"]["prompt_tokens"].as_u64(),
        "{with} {without}"
    );
}

#[test]
fn chat_echo_and_prompt_logprobs() {
    // `echo` with a continued assistant message: the reply starts with it.
    let body = json!({"messages": [
        {"role": "user", "content": "Name a city in France."},
        {"role": "assistant", "content": "One city in France is"}],
        "continue_final_message": true, "add_generation_prompt": false,
        "echo": true, "max_tokens": 4, "temperature": 0});
    let (status, v) = post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert!(text(&v).starts_with("One city in France is"), "{v}");
    let mut plain = body.clone();
    plain["echo"] = json!(false);
    let (_, p) = post("/v1/chat/completions", &plain);
    assert_eq!(text(&v), format!("One city in France is{}", text(&p)));

    let (status, v) = post(
        "/v1/chat/completions",
        &chat(json!({"prompt_logprobs": 1, "max_tokens": 2})),
    );
    assert_eq!(status, 200, "{v}");
    let lps = v["prompt_logprobs"].as_array().unwrap();
    assert_eq!(
        lps.len() as u64,
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert!(lps[0].is_null() && lps[1].is_object(), "{v}");
}

/// `return_tokens_as_token_ids`: every logprob token (and completions' `top_logprobs` keys)
/// is `token_id:N` for the token the text-named reply shows, offsets count those names, and
/// chat `bytes` stay the text's.
#[test]
fn logprob_tokens_as_token_ids() {
    let id_of = |name: &str| -> u64 {
        name.strip_prefix("token_id:")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name} is not token_id:N"))
    };
    let decode = |id: u64| -> String {
        let (_, v) = post("/detokenize", &json!({"tokens": [id]}));
        v["prompt"].as_str().unwrap().to_string()
    };
    let lp = json!({"logprobs": 2});
    let (_, named) = post("/v1/completions", &completion(lp.clone()));
    let mut extra = lp.clone();
    extra["return_tokens_as_token_ids"] = json!(true);
    let (status, ids) = post("/v1/completions", &completion(extra));
    assert_eq!(status, 200, "{ids}");
    let (named, ids) = (
        &named["choices"][0]["logprobs"],
        &ids["choices"][0]["logprobs"],
    );
    let tokens = ids["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), named["tokens"].as_array().unwrap().len());
    let mut offset = 0;
    for (i, t) in tokens.iter().enumerate() {
        let name = t.as_str().unwrap();
        assert_eq!(decode(id_of(name)), named["tokens"][i], "token {i}");
        assert_eq!(ids["text_offset"][i], offset, "offset {i}");
        offset += name.len();
        for key in ids["top_logprobs"][i].as_object().unwrap().keys() {
            id_of(key);
        }
    }
    let mut extra = json!({"logprobs": true, "top_logprobs": 2});
    extra["return_tokens_as_token_ids"] = json!(true);
    let (status, v) = post("/v1/chat/completions", &chat(extra));
    assert_eq!(status, 200, "{v}");
    for entry in v["choices"][0]["logprobs"]["content"].as_array().unwrap() {
        let text = decode(id_of(entry["token"].as_str().unwrap()));
        let bytes: Vec<u8> = entry["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
            .collect();
        assert_eq!(bytes, text.as_bytes(), "{entry}");
        for top in entry["top_logprobs"].as_array().unwrap() {
            id_of(top["token"].as_str().unwrap());
        }
    }
}
