//! `/v1/responses` streaming from chat deltas: text and function calls become OpenAI's typed
//! events as they arrive (a call's item is added with its first delta, its arguments stream as
//! `response.function_call_arguments.delta`), numbered in order, and the closing events and
//! output items agree with what was streamed.

use infer_api::responses::ResponseStream;
use serde_json::{json, Value};

fn delta(d: Value) -> Value {
    json!({"index": 0, "delta": d, "finish_reason": null})
}

fn call(index: u64, id: Option<&str>, name: Option<&str>, arguments: &str) -> Value {
    let mut function = json!({"arguments": arguments});
    if let Some(n) = name {
        function["name"] = n.into();
    }
    let mut c = json!({"index": index, "function": function});
    if let Some(id) = id {
        c["id"] = id.into();
        c["type"] = "function".into();
    }
    c
}

#[test]
fn calls_stream_as_their_arguments_arrive() {
    let mut out = ResponseStream::new("abc");
    let mut events = vec![out.event("response.created", json!({}))];
    let chunks = [
        delta(json!({"content": "Checking."})),
        delta(json!({"tool_calls": [call(0, Some("call_1"), Some("get_weather"), "")]})),
        delta(json!({"tool_calls": [call(0, None, None, "{\"city\"")]})),
        delta(json!({"tool_calls": [call(0, None, None, ": \"Paris\"}")]})),
        delta(
            json!({"tool_calls": [call(1, Some("call_2"), Some("get_time"), "{\"tz\": \"CET\"}")]}),
        ),
    ];
    let mut streamed = Vec::new();
    for c in &chunks {
        let got = out.push(c);
        streamed.push(got.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>());
        events.extend(got);
    }
    // Each delta's events go out with it, not at the end.
    assert_eq!(
        streamed[1],
        ["response.output_item.added"],
        "the call's item opens with its first delta"
    );
    assert_eq!(streamed[2], ["response.function_call_arguments.delta"]);
    assert_eq!(streamed[3], ["response.function_call_arguments.delta"]);
    assert_eq!(
        streamed[4],
        [
            "response.output_item.added",
            "response.function_call_arguments.delta"
        ]
    );
    let (closing, items) = out.finish();
    events.extend(closing);

    for (n, (kind, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], n as u64, "{kind}");
        assert_eq!(data["type"], kind.as_str());
    }
    assert_eq!(items.len(), 3);
    assert_eq!(items[0]["type"], "message");
    for (i, (id, name, args)) in [
        ("call_1", "get_weather", r#"{"city": "Paris"}"#),
        ("call_2", "get_time", r#"{"tz": "CET"}"#),
    ]
    .into_iter()
    .enumerate()
    {
        let index = i + 1;
        let item = &items[index];
        assert_eq!(
            (&item["type"], &item["call_id"], &item["name"]),
            (&json!("function_call"), &json!(id), &json!(name))
        );
        assert_eq!(item["arguments"], args);
        assert_eq!(item["status"], "completed");
        let of = |kind: &str| -> Vec<&Value> {
            events
                .iter()
                .filter(|(k, d)| k == kind && d["output_index"] == index)
                .map(|(_, d)| d)
                .collect()
        };
        let added = of("response.output_item.added");
        assert_eq!(added.len(), 1);
        assert_eq!(added[0]["item"]["status"], "in_progress");
        assert_eq!(added[0]["item"]["arguments"], "");
        let pieces: String = of("response.function_call_arguments.delta")
            .iter()
            .map(|d| {
                assert_eq!(d["item_id"], item["id"]);
                d["delta"].as_str().unwrap()
            })
            .collect();
        assert_eq!(pieces, args);
        let done = of("response.function_call_arguments.done");
        assert_eq!((done.len(), &done[0]["arguments"]), (1, &json!(args)));
        assert_eq!(of("response.output_item.done")[0]["item"], *item);
    }
    // The message closes before the calls do, and every item is done exactly once.
    let done: Vec<_> = events
        .iter()
        .filter(|(k, _)| k == "response.output_item.done")
        .map(|(_, d)| d["output_index"].as_u64().unwrap())
        .collect();
    assert_eq!(done, [0, 1, 2]);
}
