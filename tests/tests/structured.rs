//! Structured outputs through the engine with SmolLM2's tokenizer: sampled outputs (random
//! logits at temperature 1, so the grammar alone keeps them valid) always satisfy a bounded
//! JSON schema, regex or choice; greedy outputs of the real model too (any JSON object included); bad constraints are refused
//! by name before anything is queued.

use std::sync::Arc;

use infer_core::engine::testing::FixedLogitsExecutor;
use infer_core::sampling::StructuredOutput;
use infer_core::{
    Engine, EngineConfig, FinishReason, InferError, ModelExecutor, PreemptionMode, Prompt,
    SamplingParams, SchedulerConfig, Tokenizer,
};
use infer_cpu::CpuBackend;
use serde_json::{json, Value};

fn config(max_model_len: usize) -> EngineConfig {
    EngineConfig {
        block_size: 16,
        num_device_blocks: 2048,
        num_host_blocks: 0,
        max_model_len,
        enable_prefix_caching: false,
        scheduler: SchedulerConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 4096,
            preemption_mode: PreemptionMode::Recompute,
        },
    }
}

fn tokenizer() -> Arc<Tokenizer> {
    infer_tests::smollm2_shared().1
}

/// Runs every request to the end; outputs (text, finish reason) in request order.
fn run<E: infer_core::Executor>(
    engine: &mut Engine<E>,
    requests: Vec<(Prompt, SamplingParams)>,
) -> Vec<(String, FinishReason)> {
    let n = requests.len();
    for (i, (prompt, params)) in requests.into_iter().enumerate() {
        engine.add_request(format!("r{i}"), prompt, params).unwrap();
    }
    let mut out = vec![None; n];
    while engine.has_unfinished() {
        for o in engine.step().unwrap() {
            if let Some(outs) = o.outputs {
                let i: usize = o.request_id[1..].parse().unwrap();
                out[i] = Some((outs[0].text.clone(), outs[0].finish_reason));
            }
        }
    }
    out.into_iter().map(Option::unwrap).collect()
}

fn sampled(spec: StructuredOutput, seed: u64, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        max_tokens: Some(max_tokens),
        structured_outputs: Some(spec),
        ..SamplingParams::default()
    }
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "admin": {"type": "boolean"},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2}
        },
        "required": ["name", "age", "admin", "color", "tags"],
        "additionalProperties": false
    })
}

/// The checks `person_schema` makes, written out.
fn satisfies_person_schema(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): {text}"))?;
    let o = v.as_object().ok_or("not an object")?;
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["admin", "age", "color", "name", "tags"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = o["name"].as_str().ok_or("name")?;
    let age = o["age"].as_i64().ok_or("age")?;
    let tags = o["tags"].as_array().ok_or("tags")?;
    let ok = (1..=8).contains(&name.chars().count())
        && (0..=120).contains(&age)
        && o["admin"].is_boolean()
        && ["red", "green", "blue"].contains(&o["color"].as_str().unwrap_or(""))
        && tags.len() <= 2
        && tags
            .iter()
            .all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 4));
    ok.then_some(())
        .ok_or_else(|| format!("out of range: {text}"))
}

#[test]
fn sampled_outputs_always_satisfy_the_constraint() {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    let mut engine =
        Engine::new(FixedLogitsExecutor::new(vocab, 7), Some(tok), config(4096)).unwrap();
    let prompt = || Prompt::Tokens(vec![1, 2, 3]);
    let mut requests = Vec::new();
    for seed in 0..24 {
        requests.push((
            prompt(),
            sampled(StructuredOutput::Json(person_schema()), seed, 400),
        ));
    }
    for seed in 0..8 {
        requests.push((
            prompt(),
            sampled(
                StructuredOutput::Regex(r"[a-z]{2,5}-[0-9]{3}".into()),
                seed,
                64,
            ),
        ));
        let choices = vec!["yes".to_string(), "no".into(), "maybe so".into()];
        requests.push((
            prompt(),
            sampled(StructuredOutput::Choice(choices), seed, 64),
        ));
    }
    let outs = run(&mut engine, requests);
    for (i, (text, finish)) in outs.iter().enumerate() {
        assert_eq!(
            *finish,
            FinishReason::Stop,
            "request {i} did not end: {text:?}"
        );
        match i {
            0..24 => satisfies_person_schema(text).unwrap(),
            _ => match (i - 24) % 2 {
                0 => {
                    let (word, digits) = text.split_once('-').expect(text);
                    assert!((2..=5).contains(&word.len()), "{text:?}");
                    assert!(word.chars().all(|c| c.is_ascii_lowercase()), "{text:?}");
                    assert!(digits.len() == 3 && digits.chars().all(|c| c.is_ascii_digit()));
                }
                _ => assert!(
                    ["yes", "no", "maybe so"].contains(&text.as_str()),
                    "{text:?}"
                ),
            },
        }
    }
    // Random logits are not all the same draw: the constraint did not collapse the outputs.
    let distinct: std::collections::HashSet<&String> = outs[..24].iter().map(|o| &o.0).collect();
    assert!(distinct.len() > 12, "{distinct:?}");
}

#[test]
fn the_real_model_answers_greedily_within_the_constraint() {
    let (model, tok) = infer_tests::smollm2_shared();
    let exec = ModelExecutor::new(CpuBackend::new(), model.clone(), 16, 256, 0).unwrap();
    let mut cfg = config(model.max_model_len());
    cfg.num_device_blocks = 256;
    let mut engine = Engine::new(exec, Some(tok.clone()), cfg).unwrap();
    let chat = |q: &str| {
        let msgs = [infer_core::ChatMessage::user(q)];
        let text = tok.apply_chat_template(&msgs, true).unwrap();
        Prompt::Tokens(tok.encode(&text, false).unwrap())
    };
    // (`\\d` would also take other scripts' digits, as in Python's `re`.)
    let greedy = |spec| SamplingParams {
        structured_outputs: Some(spec),
        ..SamplingParams::greedy(120)
    };
    let outs = run(
        &mut engine,
        vec![
            (
                chat("Describe a user called Ann, 31, an admin who likes red, as JSON."),
                greedy(StructuredOutput::Json(person_schema())),
            ),
            (
                chat("Is Paris the capital of France? Answer yes or no."),
                greedy(StructuredOutput::Choice(vec!["yes".into(), "no".into()])),
            ),
            (
                chat("Give a date."),
                greedy(StructuredOutput::Regex(
                    r"[0-9]{4}-[0-9]{2}-[0-9]{2}".into(),
                )),
            ),
            (
                chat(
                    "What is 2+2? Reply with a JSON object whose key \"answer\" holds the number.",
                ),
                greedy(StructuredOutput::JsonObject),
            ),
        ],
    );
    satisfies_person_schema(&outs[0].0).unwrap();
    assert_eq!(outs[1].0, "yes");
    let d = &outs[2].0;
    assert!(
        d.len() == 10 && d.as_bytes()[4] == b'-' && d.as_bytes()[7] == b'-',
        "{d:?}"
    );
    let obj: Value = serde_json::from_str(&outs[3].0).expect(&outs[3].0);
    assert!(obj.is_object(), "{obj}");
}

#[test]
fn bad_constraints_are_refused_by_name() {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    let mut engine =
        Engine::new(FixedLogitsExecutor::new(vocab, 1), Some(tok), config(4096)).unwrap();
    let bad = [
        StructuredOutput::Json(json!({"type": "no-such-type"})),
        StructuredOutput::Json(json!(42)),
        StructuredOutput::Regex("(unclosed".into()),
        StructuredOutput::Grammar("start: undefined_rule".into()),
        StructuredOutput::Choice(Vec::new()),
    ];
    for spec in bad {
        let params = SamplingParams {
            structured_outputs: Some(spec.clone()),
            ..SamplingParams::greedy(8)
        };
        match engine.add_request("bad", vec![1, 2, 3], params) {
            Err(InferError::InvalidParameter { name, .. }) => {
                assert_eq!(name, "structured_outputs", "{spec:?}")
            }
            other => panic!("{spec:?}: {other:?}"),
        }
    }
    assert!(!engine.has_unfinished());
    let beams = SamplingParams {
        use_beam_search: true,
        best_of: Some(2),
        structured_outputs: Some(StructuredOutput::JsonObject),
        ..SamplingParams::greedy(8)
    };
    assert!(engine.add_request("beams", vec![1, 2, 3], beams).is_err());
}

/// vLLM's reading of object schemas: without `additionalProperties` an object allows only
/// its own keys (random logits would add others at once otherwise); `set_strict_json_schema`
/// restores JSON Schema's reading, under which some samples do add keys.
#[test]
fn objects_allow_only_their_own_keys_unless_the_schema_is_read_strictly() {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a"]
    });
    let requests = || {
        (0..16)
            .map(|seed| {
                (
                    Prompt::Tokens(vec![1, 2, 3]),
                    sampled(StructuredOutput::Json(schema.clone()), seed, 300),
                )
            })
            .collect::<Vec<_>>()
    };
    let keys = |text: &str| -> Option<Vec<String>> {
        let v: Value = serde_json::from_str(text).ok()?;
        Some(v.as_object()?.keys().cloned().collect())
    };
    let mut engine = Engine::new(
        FixedLogitsExecutor::new(vocab, 7),
        Some(tok.clone()),
        config(4096),
    )
    .unwrap();
    for (text, finish) in run(&mut engine, requests()) {
        assert_eq!(finish, FinishReason::Stop, "{text:?}");
        assert_eq!(keys(&text), Some(vec!["a".to_string()]), "{text:?}");
    }
    let mut strict =
        Engine::new(FixedLogitsExecutor::new(vocab, 7), Some(tok), config(4096)).unwrap();
    strict.set_strict_json_schema(true);
    let extra = run(&mut strict, requests())
        .iter()
        .filter(|(text, _)| keys(text).is_none_or(|k| k.len() > 1))
        .count();
    assert!(extra > 0, "no sample used the freedom to add keys");
}

#[test]
fn close_objects_marks_every_object_subschema_and_keeps_explicit_choices() {
    let mut schema = json!({
        "type": "object",
        "properties": {
            "inner": {"properties": {"x": {"type": "string"}}},
            "list": {"type": "array", "items": {"type": "object"}},
            "open": {"type": "object", "additionalProperties": true},
            "either": {"anyOf": [{"type": "object"}, {"type": "null"}]}
        },
        "$defs": {"d": {"type": ["object", "null"]}}
    });
    infer_core::sampling::structured::close_objects(&mut schema);
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["properties"]["inner"]["additionalProperties"], false);
    assert_eq!(
        schema["properties"]["list"]["items"]["additionalProperties"],
        false
    );
    assert_eq!(schema["properties"]["open"]["additionalProperties"], true);
    assert_eq!(
        schema["properties"]["either"]["anyOf"][0]["additionalProperties"],
        false
    );
    assert!(schema["properties"]["either"]["anyOf"][1]
        .get("additionalProperties")
        .is_none());
    assert_eq!(schema["$defs"]["d"]["additionalProperties"], false);
}
