//! The non-streamed completion reply builder that `infer serve` and the browser engine share
//! (`CompletionReply`): choice indices across prompts and `n`, `echo` text first, vLLM's
//! `stop_reason` as a string or a token id, `prompt_only` (max_tokens 0 with echo), usage
//! summed over prompts with cached tokens.

use infer_api::format::{CompletionReply, FinishedPrompt};
use infer_core::{CompletionOutput, FinishReason, StopReason, Tokenizer};
use serde_json::json;

fn tokenizer() -> Tokenizer {
    infer_core::open_model(&infer_tests::smollm2_path())
        .expect("SmolLM2")
        .tokenizer
}

fn output(index: usize, text: &str, ids: &[u32], stop: Option<StopReason>) -> CompletionOutput {
    CompletionOutput {
        index,
        text: text.into(),
        token_ids: ids.to_vec(),
        finish_reason: if stop.is_some() {
            FinishReason::Stop
        } else {
            FinishReason::Length
        },
        stop_reason: stop,
        cumulative_logprob: None,
        logprobs: None,
    }
}

#[test]
fn choices_of_every_prompt_in_order_with_echo_and_stop_reasons() {
    let tok = tokenizer();
    let prompts = vec![
        tok.encode("Hello there", false).unwrap(),
        tok.encode("The sky is", false).unwrap(),
    ];
    let finished = vec![
        FinishedPrompt {
            outputs: vec![
                output(0, " friend", &[1, 2], Some(StopReason::String("!".into()))),
                output(1, " you", &[3], None),
            ],
            prompt_len: prompts[0].len(),
            cached: 0,
            prompt_logprobs: vec![],
        },
        FinishedPrompt {
            outputs: vec![
                output(0, " blue", &[4, 5, 6], Some(StopReason::Token(2))),
                output(1, " grey", &[7], None),
            ],
            prompt_len: prompts[1].len(),
            cached: 16,
            prompt_logprobs: vec![],
        },
    ];
    let mut builder = CompletionReply {
        n: 2,
        echo: true,
        prompt_only: false,
        prompt_logprobs: false,
        token_ids: false,
    };
    let (choices, usage) = builder
        .choices(&tok, &prompts, finished.clone())
        .expect("builds");
    let got: Vec<_> = choices
        .iter()
        .map(|c| {
            (
                c["index"].clone(),
                c["text"].clone(),
                c["finish_reason"].clone(),
                c["stop_reason"].clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                json!(0),
                json!("Hello there friend"),
                json!("stop"),
                json!("!")
            ),
            (
                json!(1),
                json!("Hello there you"),
                json!("length"),
                json!(null)
            ),
            (json!(2), json!("The sky is blue"), json!("stop"), json!(2)),
            (
                json!(3),
                json!("The sky is grey"),
                json!("length"),
                json!(null)
            ),
        ]
    );
    let total_prompt = prompts[0].len() + prompts[1].len();
    assert_eq!(
        (
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.total_tokens
        ),
        (total_prompt, 7, total_prompt + 7)
    );
    assert_eq!(usage.prompt_tokens_details.cached_tokens, 16);

    // Without echo, the text is the generated text alone; with prompt_only, nothing of it
    // (the token generated to score the prompt is dropped) and the reason is `length`.
    builder.echo = false;
    let (plain, _) = builder
        .choices(&tok, &prompts, finished.clone())
        .expect("builds");
    assert_eq!(plain[2]["text"], " blue");
    builder.echo = true;
    builder.prompt_only = true;
    let (only, usage) = builder.choices(&tok, &prompts, finished).expect("builds");
    assert_eq!(only[2]["text"], "The sky is");
    assert_eq!(only[2]["finish_reason"], "length");
    assert_eq!(usage.completion_tokens, 0);
}
