//! Sampling and decoding on SmolLM2 through the engine: beam search against the float64
//! reference script (scripts/beam_reference.py), stop strings across token boundaries,
//! streamed text without U+FFFD, logprobs against independent forwards, top_k = 1.

use std::sync::Arc;

use infer_core::tokenizer::IncrementalDetokenizer;
use infer_core::{
    CompletionOutput, Engine, EngineConfig, FinishReason, Model, ModelExecutor, PreemptionMode,
    SamplingParams, SchedulerConfig, StopReason, Tokenizer,
};
use infer_cpu::CpuBackend;
use infer_tests::{fixtures_dir, load_cpu, smollm2_path, Loaded};
use serde::Deserialize;

/// The model twice: once behind an `Arc` for engines, once (`Loaded`) for plain forwards.
struct Smol {
    loaded: Loaded,
    model: Arc<Model<CpuBackend>>,
    tokenizer: Arc<Tokenizer>,
}

fn smol() -> Smol {
    let (model, tokenizer) = infer_tests::smollm2_shared();
    Smol {
        loaded: load_cpu(&smollm2_path()),
        model,
        tokenizer,
    }
}

fn engine(s: &Smol) -> Engine<ModelExecutor<CpuBackend>> {
    let model = s.model.clone();
    let exec = ModelExecutor::new(CpuBackend::new(), model, 16, 64, 0).unwrap();
    let config = EngineConfig {
        block_size: 16,
        num_device_blocks: 64,
        num_host_blocks: 0,
        max_model_len: 512,
        enable_prefix_caching: false,
        scheduler: SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 512,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    Engine::new(exec, Some(s.tokenizer.clone()), config).unwrap()
}

/// Runs one request, returning its streamed text and its outputs.
fn run(
    e: &mut Engine<ModelExecutor<CpuBackend>>,
    prompt: Vec<u32>,
    p: SamplingParams,
) -> (Vec<String>, infer_core::RequestOutput) {
    e.add_request("r", prompt, p).unwrap();
    let mut deltas = Vec::new();
    loop {
        for out in e.step().unwrap() {
            deltas.extend(out.deltas.iter().map(|d| d.text_delta.clone()));
            if out.finished() {
                return (deltas, out);
            }
        }
    }
}

fn outputs(out: infer_core::RequestOutput) -> Vec<CompletionOutput> {
    out.outputs.unwrap()
}

#[derive(Deserialize)]
struct BeamFixture {
    model_sha256: String,
    cases: Vec<BeamCase>,
}

#[derive(Deserialize)]
struct BeamCase {
    name: String,
    prompt_ids: Vec<u32>,
    beam_width: usize,
    max_tokens: usize,
    length_penalty: f32,
    beams: Vec<Beam>,
}

#[derive(Deserialize)]
struct Beam {
    token_ids: Vec<u32>,
    cumulative_logprob: f64,
    finish_reason: String,
}

#[test]
fn beam_search_matches_the_reference_script() {
    let path = fixtures_dir().join("beam.json");
    let f: BeamFixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(
        f.model_sha256,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    let s = smol();
    let mut saw_stop = false;
    for case in &f.cases {
        let mut e = engine(&s);
        let p = SamplingParams {
            n: case.beam_width,
            best_of: Some(case.beam_width),
            use_beam_search: true,
            temperature: 0.0,
            length_penalty: case.length_penalty,
            max_tokens: Some(case.max_tokens),
            ..Default::default()
        };
        let got = outputs(run(&mut e, case.prompt_ids.clone(), p).1);
        assert_eq!(got.len(), case.beams.len(), "{}", case.name);
        for (g, want) in got.iter().zip(&case.beams) {
            assert_eq!(g.token_ids, want.token_ids, "{}: {:?}", case.name, g.text);
            let reason = match g.finish_reason {
                FinishReason::Stop => "stop",
                FinishReason::Length => "length",
            };
            assert_eq!(reason, want.finish_reason, "{}", case.name);
            saw_stop |= reason == "stop";
            // Reference candidates differ by >= 4e-3; f32 logits are within 1e-3 of float64.
            let cum = g.cumulative_logprob.unwrap();
            assert!(
                (cum - want.cumulative_logprob).abs() < 2e-3,
                "{}: {cum} vs {}",
                case.name,
                want.cumulative_logprob
            );
        }
        let bm = e.scheduler().block_manager();
        assert_eq!(bm.num_available_device(), bm.num_device_blocks());
    }
    assert!(saw_stop, "no fixture beam finished at EOS");
}

#[test]
fn stop_strings_match_across_token_boundaries_and_are_never_streamed() {
    let s = smol();
    let m = &s.loaded;
    let tk = &m.tokenizer;
    let prompt = tk
        .encode(
            "The quick brown fox jumps over the lazy dog. In the morning, the fox",
            true,
        )
        .unwrap();
    let mut e = engine(&s);
    let (_, out) = run(&mut e, prompt.clone(), SamplingParams::greedy(24));
    let ids = outputs(out).remove(0).token_ids;
    let full = tk.decode(&ids, true).unwrap();
    // A boundary inside the text with two visible characters on each side.
    let (stop, at) = (4..ids.len() - 2)
        .find_map(|k| {
            let before = tk.decode(&ids[..k], true).unwrap();
            let after = tk.decode(&ids[..k + 1], true).unwrap();
            let tail: String = before
                .chars()
                .rev()
                .take(2)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let head: String = after[before.len()..].chars().take(2).collect();
            let stop = format!("{tail}{head}");
            let ok = tail.trim().chars().count() == 2
                && head.trim().chars().count() == 2
                && full.find(&stop) == Some(before.len() - tail.len());
            ok.then_some((stop, before.len() - tail.len()))
        })
        .expect("no boundary with two visible characters each side");
    let p = SamplingParams {
        stop: vec![stop.clone()],
        ..SamplingParams::greedy(24)
    };
    let (deltas, out) = run(&mut e, prompt, p);
    let o = outputs(out).remove(0);
    assert_eq!(o.text, full[..at], "stop {stop:?}");
    assert_eq!(o.finish_reason, FinishReason::Stop);
    assert_eq!(o.stop_reason, Some(StopReason::String(stop.clone())));
    assert_eq!(deltas.concat(), o.text);
}

#[test]
fn emoji_and_cjk_stream_without_replacement_characters() {
    let s = smol();
    let m = &s.loaded;
    let tk = &m.tokenizer;
    let text = "Emoji 🎉🚀👩‍💻 and CJK 你好，世界 日本語のテキスト 한국어";
    let ids = tk.encode(text, false).unwrap();
    let mut d = IncrementalDetokenizer::new(&[], true);
    let deltas: Vec<String> = ids.iter().map(|&t| d.push(tk, t).unwrap()).collect();
    assert!(deltas.iter().all(|s| !s.contains('\u{FFFD}')), "{deltas:?}");
    assert!(
        deltas.iter().any(String::is_empty),
        "no character was split across tokens"
    );
    assert_eq!(deltas.concat(), text);

    // And through the engine, on whatever the model says to such a prompt.
    let chat = tk
        .apply_chat_template(
            &[infer_core::ChatMessage::user(
                "Translate to Japanese and add emoji: good morning 🌅",
            )],
            true,
        )
        .unwrap();
    let mut e = engine(&s);
    let (deltas, out) = run(
        &mut e,
        tk.encode(&chat, false).unwrap(),
        SamplingParams::greedy(40),
    );
    let o = outputs(out).remove(0);
    assert!(deltas.iter().all(|s| !s.contains('\u{FFFD}')), "{deltas:?}");
    assert_eq!(deltas.concat(), o.text);
    assert!(
        !o.text.is_ascii(),
        "the reply has no multi-byte text: {:?}",
        o.text
    );
}

#[test]
fn logprobs_match_independent_forwards_and_top_k_one_is_greedy() {
    let s = smol();
    let m = &s.loaded;
    let tk = &m.tokenizer;
    let prompt = tk
        .encode("Compute 12345 + 67890 = 80235. Then", true)
        .unwrap();
    let mut e = engine(&s);
    let p = SamplingParams {
        logprobs: Some(5),
        prompt_logprobs: Some(3),
        ..SamplingParams::greedy(6)
    };
    let (_, out) = run(&mut e, prompt.clone(), p);
    let prompt_lps = out.prompt_logprobs.clone().unwrap();
    let greedy = outputs(out).remove(0);
    let log_softmax = |l: &[f32]| {
        let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = m + l.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        l.iter().map(|&x| x as f64 - lse).collect::<Vec<_>>()
    };
    // Generated tokens: each against a fresh prefill of the context before it.
    let mut ctx = prompt.clone();
    let lps = greedy.logprobs.as_ref().unwrap();
    for (i, &t) in greedy.token_ids.iter().enumerate() {
        let want = log_softmax(&m.last_logits(&ctx));
        assert!((lps[i].logprob as f64 - want[t as usize]).abs() < 1e-3);
        assert_eq!(lps[i].top_logprobs.len(), 5);
        assert_eq!(
            lps[i].top_logprobs[0].token_id, t,
            "greedy picks the top token"
        );
        ctx.push(t);
    }
    let cum: f64 = lps.iter().map(|l| l.logprob as f64).sum();
    assert!((greedy.cumulative_logprob.unwrap() - cum).abs() < 1e-4);
    // Prompt tokens: position j against a prefill of the first j tokens.
    assert!(prompt_lps[0].is_none());
    for j in [1, 4, prompt.len() - 1] {
        let want = log_softmax(&m.last_logits(&prompt[..j]));
        let got = prompt_lps[j].as_ref().unwrap();
        assert_eq!(got.token_id, prompt[j]);
        assert!(
            (got.logprob as f64 - want[prompt[j] as usize]).abs() < 1e-3,
            "position {j}"
        );
        assert_eq!(got.top_logprobs.len(), 3);
    }

    let p = SamplingParams {
        top_k: 1,
        temperature: 1.3,
        seed: Some(9),
        max_tokens: Some(6),
        ..Default::default()
    };
    let (_, out) = run(&mut e, prompt, p);
    assert_eq!(outputs(out)[0].token_ids, greedy.token_ids);
}
