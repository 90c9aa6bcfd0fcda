//! vLLM's request fields that change the output, each checked for its effect on SmolLM2
//! (greedy, so the baseline is fixed): `bad_words`, `allowed_token_ids`,
//! `include_stop_str_in_output`, `priority` ordering, and the engine's `--seed`.

use std::sync::Arc;

use infer_core::{
    Engine, EngineConfig, FinishReason, InferError, Model, ModelExecutor, PreemptionMode, Prompt,
    SamplingParams, SchedulerConfig, StopReason, Tokenizer,
};
use infer_cpu::CpuBackend;

fn engine(
    model: &Arc<Model<CpuBackend>>,
    tok: &Arc<Tokenizer>,
    max_num_seqs: usize,
) -> Engine<ModelExecutor<CpuBackend>> {
    let exec = ModelExecutor::new(CpuBackend::new(), model.clone(), 16, 256, 0).unwrap();
    let config = EngineConfig {
        block_size: 16,
        num_device_blocks: 256,
        num_host_blocks: 0,
        max_model_len: model.max_model_len(),
        enable_prefix_caching: false,
        scheduler: SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: 512,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    Engine::new(exec, Some(tok.clone()), config).unwrap()
}

fn prompt(tok: &Tokenizer, question: &str) -> Prompt {
    let msgs = [infer_core::ChatMessage::user(question)];
    let text = tok.apply_chat_template(&msgs, true).unwrap();
    Prompt::Tokens(tok.encode(&text, false).unwrap())
}

/// A finished request: id, text, token ids, stop reason, finish reason.
type Done = (String, String, Vec<u32>, Option<StopReason>, FinishReason);

/// Runs the requests; each in the order they finished.
fn run<E: infer_core::Executor>(
    engine: &mut Engine<E>,
    requests: Vec<(&str, Prompt, SamplingParams)>,
) -> Vec<Done> {
    for (id, p, params) in requests {
        engine.add_request(id, p, params).unwrap();
    }
    let mut done = Vec::new();
    while engine.has_unfinished() {
        for o in engine.step().unwrap() {
            if let Some(outs) = o.outputs {
                let out = &outs[0];
                done.push((
                    o.request_id,
                    out.text.clone(),
                    out.token_ids.clone(),
                    out.stop_reason.clone(),
                    out.finish_reason,
                ));
            }
        }
    }
    done
}

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";

#[test]
fn bad_words_and_allowed_token_ids_change_what_is_generated() {
    let (model, tok) = infer_tests::smollm2_shared();
    let mut e = engine(&model, &tok, 8);
    let base = run(
        &mut e,
        vec![("base", prompt(&tok, QUESTION), SamplingParams::greedy(24))],
    );
    let text = &base[0].1;
    assert!(text.contains("Paris"), "{text:?}");

    let banned = SamplingParams {
        bad_words: vec!["Paris".into()],
        ..SamplingParams::greedy(24)
    };
    let allowed_ids: Vec<u32> = tok.encode(" yes no maybe", false).unwrap();
    let allowed = SamplingParams {
        allowed_token_ids: Some(allowed_ids.clone()),
        ignore_eos: true,
        ..SamplingParams::greedy(8)
    };
    let outs = run(
        &mut e,
        vec![
            ("banned", prompt(&tok, QUESTION), banned),
            ("allowed", prompt(&tok, QUESTION), allowed),
        ],
    );
    for (id, text, ids, _, _) in outs {
        match id.as_str() {
            "banned" => {
                assert!(!text.contains("Paris"), "{text:?}");
                assert_ne!(&text, &base[0].1);
            }
            _ => {
                assert_eq!(ids.len(), 8);
                assert!(ids.iter().all(|t| allowed_ids.contains(t)), "{ids:?}");
            }
        }
    }
    // Ids outside the vocabulary are refused by name.
    let err = e
        .add_request(
            "bad",
            prompt(&tok, QUESTION),
            SamplingParams {
                allowed_token_ids: Some(vec![u32::MAX]),
                ..SamplingParams::greedy(4)
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("allowed_token_ids"), "{err}");
}

#[test]
fn a_kept_stop_string_ends_the_text_and_is_the_stop_reason() {
    let (model, tok) = infer_tests::smollm2_shared();
    let mut e = engine(&model, &tok, 8);
    let base = run(
        &mut e,
        vec![("base", prompt(&tok, QUESTION), SamplingParams::greedy(24))],
    );
    let stop = "Paris".to_string();
    let at = base[0].1.find(&stop).expect("the baseline names Paris");
    let with = |keep: bool| SamplingParams {
        stop: vec![stop.clone()],
        include_stop_str_in_output: keep,
        ..SamplingParams::greedy(24)
    };
    let outs = run(
        &mut e,
        vec![
            ("cut", prompt(&tok, QUESTION), with(false)),
            ("kept", prompt(&tok, QUESTION), with(true)),
        ],
    );
    for (id, text, _, reason, finish) in outs {
        assert_eq!(finish, FinishReason::Stop);
        assert_eq!(reason, Some(StopReason::String(stop.clone())));
        let want = match id.as_str() {
            "cut" => &base[0].1[..at],
            _ => &base[0].1[..at + stop.len()],
        };
        assert_eq!(text, want, "{id}");
    }
}

#[test]
fn priorities_order_admission_and_need_the_priority_policy() {
    let (model, tok) = infer_tests::smollm2_shared();
    // One sequence at a time: the queue order is the finishing order.
    let mut e = engine(&model, &tok, 1);
    let p = |priority| SamplingParams {
        priority,
        ..SamplingParams::greedy(2)
    };
    let err = e.add_request("x", prompt(&tok, "Hi"), p(1)).unwrap_err();
    assert!(
        matches!(&err, InferError::InvalidParameter { name, .. } if *name == "priority"),
        "{err}"
    );
    e.set_priority_scheduling(true);
    let outs = run(
        &mut e,
        vec![
            ("first", prompt(&tok, "Hi"), p(0)),
            ("low", prompt(&tok, "Hi"), p(5)),
            ("high", prompt(&tok, "Hi"), p(-3)),
            ("mid", prompt(&tok, "Hi"), p(1)),
        ],
    );
    let order: Vec<&str> = outs.iter().map(|o| o.0.as_str()).collect();
    // All four are queued before the first step: by priority, ties by arrival.
    assert_eq!(order, ["high", "first", "mid", "low"]);
}

#[test]
fn the_engine_seed_makes_unseeded_requests_reproducible() {
    let (model, tok) = infer_tests::smollm2_shared();
    let sampled = || SamplingParams {
        temperature: 1.0,
        max_tokens: Some(12),
        ..SamplingParams::default()
    };
    let outputs = |seed: Option<u64>| {
        let mut e = engine(&model, &tok, 8);
        e.set_seed(seed);
        let reqs = (0..3)
            .map(|i| {
                (
                    ["a", "b", "c"][i],
                    prompt(&tok, "Tell me a story."),
                    sampled(),
                )
            })
            .collect();
        let mut outs = run(&mut e, reqs);
        outs.sort_by(|x, y| x.0.cmp(&y.0));
        outs.into_iter().map(|o| o.2).collect::<Vec<_>>()
    };
    let (a, b, c) = (outputs(Some(7)), outputs(Some(7)), outputs(Some(8)));
    assert_eq!(a, b);
    assert_ne!(a, c);
    // The three requests drew different seeds from the engine's generator.
    assert!(a[0] != a[1] || a[1] != a[2], "{a:?}");
}
