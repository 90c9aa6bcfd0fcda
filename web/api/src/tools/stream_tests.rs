use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::tools::parse::ToolCallParser;

const HERMES: CallFormat = CallFormat::Parsed(ToolCallParser::Hermes);
const LLAMA3: CallFormat = CallFormat::Parsed(ToolCallParser::Llama3Json);

fn whole(format: &CallFormat, text: &str) -> (Option<String>, Vec<ToolCall>) {
    let (content, calls, _) = ToolStream::new(format.clone(), true, "call_".into()).complete(text);
    (content, calls)
}

/// What a client rebuilds from the deltas: content, and each call's id, name and arguments.
fn streamed(format: &CallFormat, pieces: &[&str]) -> (String, Vec<ToolCall>) {
    let mut s = ToolStream::new(format.clone(), true, "call_".into());
    let (mut content, mut calls) = (String::new(), Vec::<ToolCall>::new());
    for (i, p) in pieces.iter().enumerate() {
        let d = s.push(p, i + 1 == pieces.len());
        content += &d.content;
        for tc in d.tool_calls {
            let index = tc["index"].as_u64().unwrap() as usize;
            if let Some(id) = tc.get("id") {
                assert_eq!(index, calls.len(), "calls start in order");
                calls.push(ToolCall {
                    id: id.as_str().unwrap().into(),
                    name: tc["function"]["name"].as_str().unwrap().into(),
                    arguments: String::new(),
                });
            }
            let args = tc["function"]["arguments"].as_str().unwrap_or("");
            calls[index].arguments += args;
        }
    }
    (content, calls)
}

/// Every way of cutting `text` in three gives the calls the whole text gives.
fn assert_split_invariant(format: &CallFormat, text: &str) {
    let (_, want) = whole(format, text);
    let cuts: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    for &a in &cuts {
        for &b in cuts.iter().filter(|&&b| b >= a).step_by(3) {
            let (_, got) = streamed(format, &[&text[..a], &text[a..b], &text[b..]]);
            assert_eq!(got, want, "cut at {a} and {b}: {text:?}");
        }
    }
}

#[test]
fn hermes_prose_then_calls() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": {\"c\": true}}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>";
    let (content, calls) = whole(&HERMES, text);
    assert_eq!(content.as_deref(), Some("Let me check."));
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(
        calls[0].arguments,
        "{\"city\": \"Paris\", \"unit\": {\"c\": true}}"
    );
    assert_eq!(
        (calls[1].id.as_str(), calls[1].arguments.as_str()),
        ("call_1", "{}")
    );
    assert_split_invariant(&HERMES, text);
    let (streamed_content, _) = streamed(&HERMES, &[&text[..20], &text[20..]]);
    assert_eq!(streamed_content, "Let me check.");
    // Arguments go out as they arrive, before the call closes.
    let mut s = ToolStream::new(HERMES, true, "c".into());
    let cut = text.find("Paris").unwrap();
    let early = s.push(&text[..cut], false);
    assert_eq!(early.tool_calls[0]["function"]["name"], "get_weather");
    assert_eq!(
        early.tool_calls[0]["function"]["arguments"],
        "{\"city\": \""
    );
}

#[test]
fn hermes_without_calls_or_with_bad_json_is_content() {
    let prose = "No tools needed: 2 < 3.";
    assert_eq!(whole(&HERMES, prose), (Some(prose.into()), vec![]));
    let (c, _) = streamed(&HERMES, &[&prose[..14], &prose[14..]]);
    assert_eq!(c, prose);
    let bad = "<tool_call>{\"name\": \"f\", \"arguments\": {oops}}</tool_call>";
    assert_eq!(whole(&HERMES, bad), (Some(bad.into()), vec![]));
    // An unclosed call at the end still counts (models stop at the closing tag's token).
    let (_, calls) = whole(
        &HERMES,
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
    );
    assert_eq!(calls[0].arguments, "{\"a\": 1}");
}

#[test]
fn arguments_first_or_reordered_still_parse() {
    let text = "<tool_call>{\"arguments\": {\"x\": [1, 2]}, \"name\": \"f\"}</tool_call>";
    let (_, calls) = whole(&HERMES, text);
    assert_eq!(
        (calls[0].name.as_str(), calls[0].arguments.as_str()),
        ("f", "{\"x\":[1,2]}")
    );
    assert_split_invariant(&HERMES, text);
}

#[test]
fn llama3_json_calls_and_prose() {
    let text = "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x;y\"}}; {\"name\": \"b\", \"parameters\": {}}";
    let (content, calls) = whole(&LLAMA3, text);
    assert_eq!(content, None);
    let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(calls[0].arguments, "{\"q\": \"x;y\"}");
    assert_split_invariant(&LLAMA3, text);
    let prose = "The answer is {not a call}.";
    assert_eq!(whole(&LLAMA3, prose), (Some(prose.into()), vec![]));
    // Prose that starts like a call streams as content once it turns out not to be one.
    let brace = "{braces} are punctuation.";
    assert_eq!(whole(&LLAMA3, brace), (Some(brace.into()), vec![]));
    assert_eq!(streamed(&LLAMA3, &[&brace[..3], &brace[3..]]).0, brace);
    let bad = "So: <tool_call>{oops}</tool_call>";
    assert_eq!(streamed(&HERMES, &[&bad[..9], &bad[9..]]).0, bad);
}

#[test]
fn required_array_and_named_arguments() {
    let text = "[{\"name\": \"f\", \"parameters\": {\"n\": 1}}, {\"name\": \"g\", \"parameters\": {\"s\": \"}\"}}]";
    let (content, calls) = whole(&CallFormat::Array, text);
    assert_eq!(content, None);
    assert_eq!(calls[1].arguments, "{\"s\": \"}\"}");
    assert_split_invariant(&CallFormat::Array, text);
    let named = CallFormat::Arguments("f".into());
    let (content, calls) = whole(&named, "{\"n\": 1}");
    assert_eq!((content, calls[0].name.as_str()), (None, "f"));
    assert_split_invariant(&named, "{\"n\": {\"m\": 2}}");
    // Cut short (finish_reason length): not a call, the text comes back as content.
    assert_eq!(whole(&named, "{\"n\": ").1, vec![]);
}

#[test]
fn one_call_without_parallel_tool_calls() {
    let text = "[{\"name\": \"f\", \"parameters\": {}}, {\"name\": \"g\", \"parameters\": {}}]";
    let (_, calls, s) = ToolStream::new(CallFormat::Array, false, "c".into()).complete(text);
    assert_eq!(calls.len(), 1);
    assert_eq!(s.finish_reason("stop"), "tool_calls");
    let (_, _, s) =
        ToolStream::new(CallFormat::Arguments("f".into()), true, "c".into()).complete("{}");
    assert_eq!(s.finish_reason("stop"), "stop");
}

fn call_json() -> impl Strategy<Value = String> {
    let key = "[a-z]{1,6}";
    let leaf = prop_oneof![
        any::<i32>().prop_map(Value::from),
        "[ -~]{0,8}".prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
    ];
    let value = leaf.prop_recursive(3, 12, 4, move |inner| {
        prop::collection::btree_map(key, inner, 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    });
    (
        "[a-z_]{1,10}",
        prop::collection::btree_map("[a-z]{1,6}", value, 0..4),
        any::<bool>(),
    )
        .prop_map(|(name, args, pretty)| {
            let args = Value::Object(args.into_iter().collect());
            let args = if pretty {
                serde_json::to_string_pretty(&args).unwrap()
            } else {
                args.to_string()
            };
            format!("{{\"name\": \"{name}\", \"arguments\": {args}}}")
        })
}

proptest! {
    /// However the text arrives, the calls a client reassembles are the non-streamed ones.
    #[test]
    fn hermes_stream_reassembles_to_the_whole(
        prose in "[a-zA-Z .<>]{0,20}",
        calls in prop::collection::vec(call_json(), 1..3),
        cuts in prop::collection::vec(0usize..400, 0..8),
    ) {
        let mut text = prose.clone();
        for c in &calls {
            text += &format!("\n<tool_call>\n{c}\n</tool_call>");
        }
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (text.len() + 1))
            .filter(|&c| text.is_char_boundary(c)).collect();
        cuts.sort();
        cuts.dedup();
        let mut pieces = Vec::new();
        let mut at = 0;
        for c in cuts {
            pieces.push(&text[at..c]);
            at = c;
        }
        pieces.push(&text[at..]);
        let (want_content, want) = whole(&HERMES, &text);
        let (content, got) = streamed(&HERMES, &pieces);
        prop_assert_eq!(got.len(), calls.len());
        prop_assert_eq!(&got, &want);
        for (call, text) in got.iter().zip(&calls) {
            let v: Value = serde_json::from_str(text).unwrap();
            let args: Value = serde_json::from_str(&call.arguments).unwrap();
            prop_assert_eq!(&args, &v["arguments"]);
        }
        let want_content = want_content.unwrap_or_default();
        prop_assert_eq!(content.trim(), want_content.trim());
    }
}
