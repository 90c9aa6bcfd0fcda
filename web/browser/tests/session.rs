//! The browser's request bookkeeping, natively: SmolLM2 on the CPU engine stepped through
//! `Session` as the worker does; streamed and JSON replies agree, chunks are shaped as
//! `infer serve` sends them, bad bodies are 400s naming the parameter, abort forgets.

use infer_browser::session::{Event, Session};
use infer_core::{Engine, EngineConfig, ModelExecutor, PreemptionMode, SchedulerConfig};
use infer_cpu::CpuBackend;
use serde_json::{json, Value};

fn run(session: &mut Session, engine: &mut CpuEngine, endpoint: &str, body: Value) -> Vec<Event> {
    let (_, requests, mut events) = session.prepare(endpoint, &body.to_string()).unwrap();
    for r in requests {
        engine.add_request(r.id, r.prompt, r.params).unwrap();
    }
    while engine.has_unfinished() {
        for out in engine.step().unwrap() {
            events.extend(session.on_output(out));
        }
    }
    events
}

type CpuEngine = Engine<ModelExecutor<CpuBackend>>;

fn engine_and_session() -> (CpuEngine, Session) {
    let (model, tokenizer) = infer_tests::smollm2_shared();
    let config = EngineConfig {
        block_size: 16,
        num_device_blocks: 256,
        num_host_blocks: 0,
        max_model_len: 2048,
        enable_prefix_caching: true,
        scheduler: SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 256,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    let exec = ModelExecutor::new(CpuBackend::new(), model, 16, 256, 0).unwrap();
    let engine = Engine::new(exec, Some(tokenizer.clone()), config).unwrap();
    (engine, Session::new(tokenizer, "smollm2".into(), 2048))
}

fn chunks(events: &[Event]) -> Vec<&Value> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Chunk { chunk, .. } => Some(chunk),
            _ => None,
        })
        .collect()
}

#[test]
fn session_streams_and_replies_like_the_server() {
    let (mut engine, mut session) = engine_and_session();

    let body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 10, "temperature": 0});
    let events = run(&mut session, &mut engine, "chat", body.clone());
    let [Event::Done {
        response: Some(reply),
        aborted: false,
        ..
    }] = &events[..]
    else {
        panic!("{events:?}");
    };
    assert_eq!(reply["object"], "chat.completion");
    let text = reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!text.is_empty());

    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = run(&mut session, &mut engine, "chat", streamed);
    let chunks = chunks(&events);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let joined: String = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap())
        .filter_map(|c| c["delta"]["content"].as_str())
        .collect();
    assert_eq!(joined, text);
    // The same counts; the streamed run, second, found the prompt in the prefix cache.
    let (streamed, whole) = (&chunks.last().unwrap()["usage"], &reply["usage"]);
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(streamed[k], whole[k], "{k}");
    }
    let cached = |u: &Value| {
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert!(cached(streamed) > cached(whole), "{streamed} vs {whole}");
    assert!(matches!(
        events.last(),
        Some(Event::Done {
            response: None,
            aborted: false,
            ..
        })
    ));

    // Two prompts, n = 2: four choices indexed prompt * n + sample.
    let body = json!({"prompt": ["Hello", "The sky is"], "max_tokens": 3, "n": 2, "temperature": 0.8, "seed": 1});
    let events = run(&mut session, &mut engine, "completion", body);
    let Some(Event::Done {
        response: Some(r), ..
    }) = events.last()
    else {
        panic!("{events:?}");
    };
    let mut idx: Vec<u64> = r["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    idx.sort();
    assert_eq!(idx, [0, 1, 2, 3]);
    assert_eq!(r["usage"]["completion_tokens"], 12);

    let err = session
        .prepare("completion", r#"{"prompt": "x", "temperature": -1}"#)
        .unwrap_err();
    assert_eq!(
        (err.status, err.param.as_deref()),
        (400, Some("temperature"))
    );
    let err = session.prepare("chat", "{not json").unwrap_err();
    assert_eq!(err.status, 400);

    let (id, requests, _) = session
        .prepare("completion", r#"{"prompt": "x", "max_tokens": 50}"#)
        .unwrap();
    assert_eq!(session.engine_ids(&id), vec![requests[0].id.clone()]);
    assert!(matches!(
        session.abort(&id),
        Some(Event::Done { aborted: true, .. })
    ));
    assert_eq!(session.num_active(), 0);
}

#[test]
fn tokenize_and_detokenize_answer_like_the_server() {
    let (_, tokenizer) = infer_tests::smollm2_shared();
    let session = Session::new(tokenizer.clone(), "smollm2".into(), 2048);
    let text = "<|im_start|>user\nHi 12345<|im_end|>";
    let r = session
        .tokenizer_call("tokenize", &json!({"prompt": text}).to_string())
        .unwrap();
    let ids = tokenizer.encode(text, true).unwrap();
    assert_eq!(
        r,
        json!({"count": ids.len(), "max_model_len": 2048, "tokens": ids})
    );
    let r = session
        .tokenizer_call("detokenize", &json!({"tokens": ids}).to_string())
        .unwrap();
    assert_eq!(r, json!({"prompt": text}));
    let e = session
        .tokenizer_call("detokenize", &json!({"tokens": [1, 999_999]}).to_string())
        .unwrap_err();
    assert_eq!((e.status, e.param.as_deref()), (400, Some("tokens")));
    let e = session
        .tokenizer_call("tokenize", &json!({"text": "x"}).to_string())
        .unwrap_err();
    assert_eq!(e.status, 400, "{e}");
    let r = session
        .tokenizer_call(
            "tokenize",
            &json!({"prompt": "x", "return_token_strs": true}).to_string(),
        )
        .unwrap();
    assert_eq!(r["token_strs"], json!(["x"]));
    let e = session
        .tokenizer_call(
            "tokenize",
            &json!({"prompt": "x", "strs": true}).to_string(),
        )
        .unwrap_err();
    assert!(e.status == 400 && e.message.contains("strs"), "{e}");
    let e = session
        .tokenizer_call(
            "tokenize",
            &json!({"prompt": "x", "model": "other"}).to_string(),
        )
        .unwrap_err();
    assert_eq!((e.status, e.param.as_deref()), (404, Some("model")));
    let r = session
        .tokenizer_call(
            "tokenize",
            &json!({"prompt": "x", "model": "smollm2"}).to_string(),
        )
        .unwrap();
    assert_eq!(r["tokens"], json!(tokenizer.encode("x", true).unwrap()));
}

#[test]
fn session_reads_tool_calls_like_the_server() {
    let (mut engine, mut session) = engine_and_session();
    let body = json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"], "additionalProperties": false}}}],
        "tool_choice": "required", "max_tokens": 40, "temperature": 0,
    });
    let events = run(&mut session, &mut engine, "chat", body.clone());
    let Some(Event::Done {
        response: Some(reply),
        ..
    }) = events.last()
    else {
        panic!("{events:?}");
    };
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{args}");

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let events = run(&mut session, &mut engine, "chat", streamed);
    let (mut name, mut arguments, mut finish) = (String::new(), String::new(), Value::Null);
    for c in chunks(&events) {
        let choice = &c["choices"][0];
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            name += d["function"]["name"].as_str().unwrap_or("");
            arguments += d["function"]["arguments"].as_str().unwrap_or("");
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    assert_eq!(name, "get_weather");
    assert_eq!(arguments, call["function"]["arguments"].as_str().unwrap());
    assert_eq!(finish, "tool_calls");
}
