//! The continuous-batching engine on SmolLM2: many greedy requests through a KV pool too small
//! for all of them (preemption by recompute and by swap) produce exactly what each produces
//! alone, seeded samples and their logprobs are the same bits batched as alone, and a shared
//! prompt prefix is served from the prefix cache without changing output.

use std::sync::Arc;

use infer_core::{
    Engine, EngineConfig, Model, ModelExecutor, PreemptionMode, Prompt, SamplingParams,
    SchedulerConfig, Tokenizer,
};
use infer_cpu::CpuBackend;

struct Smol {
    model: Arc<Model<CpuBackend>>,
    tokenizer: Arc<Tokenizer>,
}

fn smol() -> Smol {
    let (model, tokenizer) = infer_tests::smollm2_shared();
    Smol { model, tokenizer }
}

fn engine(
    s: &Smol,
    blocks: usize,
    host: usize,
    mode: PreemptionMode,
    prefix: bool,
) -> Engine<ModelExecutor<CpuBackend>> {
    let exec = ModelExecutor::new(CpuBackend::new(), s.model.clone(), 16, blocks, host).unwrap();
    let config = EngineConfig {
        block_size: 16,
        num_device_blocks: blocks,
        num_host_blocks: host,
        max_model_len: s.model.max_model_len(),
        enable_prefix_caching: prefix,
        scheduler: SchedulerConfig {
            max_num_seqs: 32,
            max_num_batched_tokens: 192,
            preemption_mode: mode,
        },
    };
    Engine::new(exec, Some(s.tokenizer.clone()), config).unwrap()
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams::greedy(max_tokens)
}

const TOPICS: [&str; 8] = [
    "the history of Rome",
    "how volcanoes form",
    "why the sky is blue",
    "the rules of chess",
    "making bread at home",
    "the life of bees",
    "how computers add numbers",
    "the water cycle",
];

/// 32 prompts of 12 to 65 tokens, up to 8 to 40 output tokens (many stop earlier at EOS).
fn workload(s: &Smol) -> Vec<(Vec<u32>, SamplingParams)> {
    (0..32)
        .map(|i| {
            let mut text = format!("Question {i}: tell me about {}.", TOPICS[i % 8]);
            for _ in 0..i % 5 {
                text.push_str(" Please be precise, give examples, and explain each step clearly.");
            }
            let ids = s.tokenizer.encode(&text, true).unwrap();
            (ids, greedy(8 + (i * 7) % 33))
        })
        .collect()
}

/// Each request alone, through its own engine with room for everything.
fn alone(s: &Smol, work: &[(Vec<u32>, SamplingParams)]) -> Vec<Vec<u32>> {
    work.iter()
        .map(|(ids, p)| {
            let mut e = engine(s, 16, 0, PreemptionMode::Recompute, false);
            let out = e.generate(
                vec![Prompt::Tokens(ids.clone())],
                std::slice::from_ref(p),
                &mut |_| {},
            );
            out.unwrap().remove(0).outputs.remove(0).token_ids
        })
        .collect()
}

fn together(
    s: &Smol,
    work: &[(Vec<u32>, SamplingParams)],
    mode: PreemptionMode,
) -> (Vec<Vec<u32>>, u64) {
    // 12 blocks of 16 tokens hold 192 tokens; the workload needs about 2,000 at once.
    let mut e = engine(s, 12, 64, mode, true);
    let prompts = work
        .iter()
        .map(|(ids, _)| Prompt::Tokens(ids.clone()))
        .collect();
    let params: Vec<_> = work.iter().map(|(_, p)| p.clone()).collect();
    let out = e.generate(prompts, &params, &mut |_| {}).unwrap();
    e.scheduler().check_invariants().unwrap();
    assert_eq!(e.scheduler().block_manager().num_available_device(), 12);
    (
        out.into_iter()
            .map(|mut r| r.outputs.remove(0).token_ids)
            .collect(),
        e.stats().preemptions,
    )
}

#[test]
fn batched_greedy_outputs_equal_single_request_outputs_under_preemption() {
    let s = smol();
    let work = workload(&s);
    let want = alone(&s, &work);
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        let (got, preemptions) = together(&s, &work, mode);
        assert!(
            preemptions > 0,
            "{mode:?}: the pool was meant to force preemption"
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g, w,
                "{mode:?}: request {i} differs from its single-request run"
            );
        }
    }
}

/// A K-quant model (Q4_K and Q6_K: integer kernels for decode-sized batches, GEMM for larger
/// ones) gives each request the same greedy tokens in a crowded batch as alone. Prompts of 1 to
/// 40 tokens make some prefills small enough for the integer kernels when alone while batched
/// steps put them into GEMM-sized ones, and back.
#[test]
fn a_k_quant_model_gives_the_same_tokens_batched_as_alone() {
    let path = infer_tests::fixtures_dir().join("tiny/llama_q4_k_q6_k.gguf");
    let (model, tokenizer) = infer_tests::shared_model(path.to_str().unwrap());
    let s = Smol { model, tokenizer };
    let vocab = s.model.config().vocab_size as u64;
    let mut state = 7u64;
    let work: Vec<_> = (0..24)
        .map(|i| {
            let ids = (0..1 + (i * 13) % 40)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((state >> 33) % vocab) as u32
                })
                .collect();
            (ids, greedy(8 + (i * 5) % 17))
        })
        .collect();
    let want = alone(&s, &work);
    let (got, _) = together(&s, &work, PreemptionMode::Recompute);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "request {i} differs from its single-request run");
    }
}

/// Seeded sampling draws the same tokens with the same logprobs, bit for bit, alone and in a
/// crowded batch: prefills beside decodes, preemption by recompute (a sequence's prompt and
/// generated tokens computed again as one prefill) and prefix-cache hits. The CPU backend's
/// matmuls and attention do not depend on the batch; one rounding's difference anywhere shows
/// in the logprobs even where the tokens agree.
#[test]
fn seeded_samples_and_logprobs_are_the_same_bits_alone_and_batched() {
    let s = smol();
    let work: Vec<_> = workload(&s)
        .into_iter()
        .take(12)
        .enumerate()
        .map(|(i, (ids, _))| {
            let params = SamplingParams {
                temperature: 0.8,
                seed: Some(i as u64),
                max_tokens: Some(16),
                logprobs: Some(0),
                ignore_eos: true,
                ..Default::default()
            };
            (ids, params)
        })
        .collect();
    let bits = |out: &infer_core::CompletionOutput| -> Vec<(u32, u32)> {
        let logprobs = out.logprobs.as_ref().expect("logprobs were asked for");
        logprobs
            .iter()
            .map(|l| (l.token_id, l.logprob.to_bits()))
            .collect()
    };
    let want: Vec<_> = work
        .iter()
        .map(|(ids, p)| {
            let mut e = engine(&s, 16, 0, PreemptionMode::Recompute, false);
            let prompt = vec![Prompt::Tokens(ids.clone())];
            let out = e.generate(prompt, std::slice::from_ref(p), &mut |_| {});
            bits(&out.unwrap()[0].outputs[0])
        })
        .collect();
    let mut e = engine(&s, 12, 0, PreemptionMode::Recompute, true);
    let prompts = work.iter().map(|(ids, _)| Prompt::Tokens(ids.clone()));
    let params: Vec<_> = work.iter().map(|(_, p)| p.clone()).collect();
    let got = e.generate(prompts.collect(), &params, &mut |_| {}).unwrap();
    assert!(
        e.stats().preemptions > 0,
        "the pool was meant to force preemption"
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            &bits(&g.outputs[0]),
            w,
            "request {i}: batched differs from alone"
        );
    }
}

#[test]
fn a_shared_prefix_is_served_from_the_cache_with_unchanged_output() {
    let s = smol();
    let system = "You are a careful assistant. Answer in one short sentence, use plain words, \
                  avoid lists, never guess, and say so when a question has no clear answer. \
                  Prefer the metric system, spell out abbreviations the first time they appear, \
                  and keep a friendly, calm tone even when the question is odd or the user is rude. ";
    let prefix: Vec<u32> = s.tokenizer.encode(system, true).unwrap()[..64].to_vec();
    let with_tail = |q: &str| {
        let mut ids = prefix.clone();
        ids.extend(s.tokenizer.encode(q, false).unwrap());
        ids
    };
    let (a, b) = (with_tail("What is ice?"), with_tail("Why do birds sing?"));
    let want_b = alone(&s, &[(b.clone(), greedy(12))]).remove(0);

    let mut e = engine(&s, 64, 0, PreemptionMode::Recompute, true);
    e.generate(vec![Prompt::Tokens(a)], &[greedy(12)], &mut |_| {})
        .unwrap();
    assert_eq!(e.stats().prefix_cache_hit_tokens, 0);
    let got_b = e
        .generate(vec![Prompt::Tokens(b)], &[greedy(12)], &mut |_| {})
        .unwrap();
    assert_eq!(
        e.stats().prefix_cache_hit_tokens,
        64,
        "four full 16-token blocks reused"
    );
    assert_eq!(got_b[0].first().token_ids, want_b);
}
