//! The engine over the simulated-KV executor: whatever the arrivals, pool sizes and aborts,
//! every request gets exactly the tokens its own context determines, and nothing leaks.

use proptest::prelude::*;

use super::finish::FinishReason;
use super::testing::{simulated_next_token, SimulatedKvExecutor};
use super::*;
use crate::scheduler::PreemptionMode;

const VOCAB: usize = 1000;
const STOP: u32 = 7;
const MAX_MODEL_LEN: usize = 96;

struct Case {
    block_size: usize,
    num_blocks: usize,
    host_blocks: usize,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    mode: PreemptionMode,
    prefix_caching: bool,
    /// Speculative decoding: the proposer's kind and k.
    spec: Option<(SpecKind, usize)>,
    /// Every layer attends within this window: blocks that leave it are freed.
    window: Option<usize>,
}

/// Proposers for the property test: the n-gram lookup, a draft that knows the simulated
/// model but errs (many rejections), and a draft model on its own simulated executor.
#[derive(Debug, Clone, Copy)]
pub(super) enum SpecKind {
    Ngram,
    Erring { one_in: u64 },
    Draft { num_blocks: usize },
}

/// A request: prompt, max_tokens, the step it arrives at, and the step it is aborted at.
type Spec = (Vec<u32>, usize, usize, Option<usize>);

fn expected(prompt: &[u32], max_tokens: usize, window: Option<usize>) -> (Vec<u32>, FinishReason) {
    let mut ctx = prompt.to_vec();
    let max_len = (prompt.len() + max_tokens).min(MAX_MODEL_LEN);
    loop {
        let first = window.map_or(0, |w| ctx.len().saturating_sub(w));
        let t = simulated_next_token(&ctx[first..], VOCAB);
        ctx.push(t);
        if t == STOP {
            return (ctx[prompt.len()..].to_vec(), FinishReason::Stop);
        }
        if ctx.len() >= max_len {
            return (ctx[prompt.len()..].to_vec(), FinishReason::Length);
        }
    }
}

fn params(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        stop_token_ids: vec![STOP],
        ..SamplingParams::greedy(max_tokens)
    }
}

/// Runs the specs; returns total preemptions, the most sequences ever swapped at once, and
/// the engine's counters.
fn run(case: &Case, specs: &[Spec]) -> (u64, usize, EngineStats) {
    let mut exec =
        SimulatedKvExecutor::new(VOCAB, case.block_size, case.num_blocks, case.host_blocks);
    exec.window = case.window;
    let mut engine = Engine::new(
        exec,
        None,
        EngineConfig {
            block_size: case.block_size,
            num_device_blocks: case.num_blocks,
            num_host_blocks: case.host_blocks,
            max_model_len: MAX_MODEL_LEN,
            enable_prefix_caching: case.prefix_caching,
            scheduler: SchedulerConfig {
                max_num_seqs: case.max_num_seqs,
                max_num_batched_tokens: case.max_num_batched_tokens,
                preemption_mode: case.mode,
            },
        },
    )
    .unwrap();
    if let Some((kind, k)) = case.spec {
        engine.set_speculator(Some(super::spec_tests::speculator(
            kind,
            k,
            VOCAB,
            case.block_size,
        )));
    }
    let mut got: HashMap<String, (Vec<u32>, Option<FinishReason>)> = HashMap::new();
    let mut live = std::collections::HashSet::new();
    let mut max_swapped = 0;
    let last_arrival = specs.iter().map(|s| s.2).max().unwrap_or(0);
    for step in 0..20_000 {
        for (i, (prompt, max_tokens, arrive, abort)) in specs.iter().enumerate() {
            let id = i.to_string();
            if *arrive == step {
                let max_len = (prompt.len() + max_tokens).min(MAX_MODEL_LEN);
                let added = engine.add_request(id.clone(), prompt.clone(), params(*max_tokens));
                let fits = max_len.div_ceil(case.block_size) <= case.num_blocks;
                assert_eq!(
                    added.is_ok(),
                    fits && prompt.len() < MAX_MODEL_LEN,
                    "{added:?}"
                );
                if added.is_ok() {
                    live.insert(id.clone());
                    got.insert(id.clone(), (Vec::new(), None));
                }
            }
            if *abort == Some(step) && live.remove(&id) {
                assert!(engine.abort_request(&id));
                got.remove(&id);
            }
        }
        if !engine.has_unfinished() && step > last_arrival {
            break;
        }
        if engine.has_unfinished() {
            for out in engine.step().unwrap() {
                let entry = got.get_mut(&out.request_id).unwrap();
                assert!(entry.1.is_none(), "output after finish");
                for d in &out.deltas {
                    entry.0.extend(&d.new_token_ids);
                    entry.1 = d.finish_reason;
                }
                if out.finished() {
                    live.remove(&out.request_id);
                }
            }
        }
        engine.scheduler().check_invariants().unwrap();
        max_swapped = max_swapped.max(engine.scheduler().num_swapped());
    }
    assert!(!engine.has_unfinished(), "requests never finished");
    for (i, (prompt, max_tokens, _, _)) in specs.iter().enumerate() {
        if let Some((tokens, reason)) = got.get(&i.to_string()) {
            let (want, want_reason) = expected(prompt, *max_tokens, case.window);
            assert_eq!(tokens, &want, "request {i}");
            assert_eq!(*reason, Some(want_reason), "request {i}");
        }
    }
    let bm = engine.scheduler().block_manager();
    assert_eq!(bm.num_available_device(), case.num_blocks);
    assert_eq!(bm.num_free_host(), case.host_blocks);
    (engine.stats().preemptions, max_swapped, engine.stats())
}

fn prompt_strategy() -> impl Strategy<Value = Vec<u32>> {
    // Prompts from three families share long prefixes, so prefix caching has hits.
    (
        0u32..3,
        0usize..40,
        prop::collection::vec(0u32..VOCAB as u32, 1..30),
    )
        .prop_map(|(family, shared, tail)| {
            let mut p: Vec<u32> = (0..shared as u32).map(|i| 100 * family + i).collect();
            p.extend(tail);
            p
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn every_request_gets_its_own_tokens_and_nothing_leaks(
        specs in prop::collection::vec(
            (prompt_strategy(), 1usize..40, 0usize..12, prop::option::weighted(0.15, 0usize..30)),
            1..20,
        ),
        block_size in prop::sample::select(vec![1usize, 2, 4, 8, 16]),
        extra_blocks in 0usize..48,
        host_blocks in 0usize..40,
        max_num_seqs in 1usize..10,
        extra_tokens in 0usize..64,
        swap in any::<bool>(),
        prefix_caching in any::<bool>(),
        spec in prop::option::of((
            prop_oneof![
                Just(SpecKind::Ngram),
                (2u64..6).prop_map(|one_in| SpecKind::Erring { one_in }),
                (4usize..64).prop_map(|num_blocks| SpecKind::Draft { num_blocks }),
            ],
            1usize..6,
        )),
        window in prop::option::weighted(0.3, 1usize..24),
    ) {
        let case = Case {
            block_size,
            num_blocks: 96 / block_size / 2 + extra_blocks,
            host_blocks,
            max_num_seqs,
            max_num_batched_tokens: max_num_seqs + extra_tokens,
            mode: if swap { PreemptionMode::Swap } else { PreemptionMode::Recompute },
            prefix_caching,
            spec,
            window,
        };
        run(&case, &specs);
    }
}

fn crowded(mode: PreemptionMode) -> (u64, usize) {
    let (preemptions, swapped, _) = crowded_with(mode, None);
    (preemptions, swapped)
}

/// Twelve requests in a pool that holds a few: preemption on every few steps.
pub(super) fn crowded_with(
    mode: PreemptionMode,
    spec: Option<(SpecKind, usize)>,
) -> (u64, usize, EngineStats) {
    let specs: Vec<Spec> = (0..12)
        .map(|i| ((0..10 + i).map(|t| t * 31 + i).collect(), 40, 0, None))
        .collect();
    let case = Case {
        block_size: 4,
        num_blocks: 40,
        host_blocks: 64,
        max_num_seqs: 12,
        max_num_batched_tokens: 32,
        mode,
        prefix_caching: true,
        spec,
        window: None,
    };
    run(&case, &specs)
}

/// A model whose every layer slides: long requests in a crowded pool give back the blocks
/// their window has left (and still produce their own tokens, every read slot checked).
#[test]
fn a_sliding_window_frees_blocks_as_requests_run() {
    let specs: Vec<Spec> = (0..6)
        .map(|i| ((0..20 + i).map(|t| t * 7 + i).collect(), 60, 0, None))
        .collect();
    let case = Case {
        block_size: 4,
        num_blocks: 48,
        host_blocks: 32,
        max_num_seqs: 6,
        max_num_batched_tokens: 16,
        mode: PreemptionMode::Swap,
        prefix_caching: true,
        spec: None,
        window: Some(8),
    };
    let (_, _, stats) = run(&case, &specs);
    // Each request of ~85 tokens keeps about 3 blocks of its 22: most of them go back.
    assert!(stats.window_released_blocks >= 6 * 15, "{stats:?}");
}

#[test]
fn a_crowded_pool_preempts_by_recompute() {
    let (preemptions, swapped) = crowded(PreemptionMode::Recompute);
    assert!(preemptions > 0);
    assert_eq!(swapped, 0);
}

#[test]
fn a_crowded_pool_preempts_by_swap() {
    let (preemptions, swapped) = crowded(PreemptionMode::Swap);
    assert!(preemptions > 0);
    assert!(swapped > 0);
}

#[test]
fn a_request_the_pool_cannot_hold_is_refused_up_front() {
    let exec = SimulatedKvExecutor::new(VOCAB, 4, 4, 0);
    let cfg = EngineConfig {
        block_size: 4,
        num_device_blocks: 4,
        num_host_blocks: 0,
        max_model_len: 64,
        enable_prefix_caching: false,
        scheduler: SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 16,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    let mut e = Engine::new(exec, None, cfg).unwrap();
    let err = e.add_request("a", vec![1u32; 10], params(10)).unwrap_err();
    assert!(err.to_string().contains("KV pool holds 4 blocks"), "{err}");
    assert!(matches!(
        e.add_request("b", vec![1u32; 64], params(1)),
        Err(InferError::PromptTooLong { .. })
    ));
    assert!(e.add_request("c", Vec::<u32>::new(), params(1)).is_err());
    assert!(
        e.add_request("d", "text", params(1)).is_err(),
        "no tokenizer"
    );
    e.add_request("e", vec![1u32; 3], params(2)).unwrap();
    assert!(
        e.add_request("e", vec![1u32; 3], params(2)).is_err(),
        "duplicate id"
    );
    assert!(!e.has_unfinished() || e.num_unfinished() == 1);
}

/// Greedy requests without logprobs take the executor's argmax shortcut (a GPU reads back one
/// id per row); the tokens are those of the logits rows, and a batch holding any other row
/// reads logits rows.
#[test]
fn plain_greedy_steps_use_the_executors_argmax_and_give_the_same_tokens() {
    let run = |device_argmax: bool, with_sampled: bool| {
        let mut exec = SimulatedKvExecutor::new(VOCAB, 4, 64, 0);
        exec.device_argmax = device_argmax;
        let cfg = EngineConfig {
            block_size: 4,
            num_device_blocks: 64,
            num_host_blocks: 0,
            max_model_len: 64,
            enable_prefix_caching: false,
            scheduler: SchedulerConfig {
                max_num_seqs: 4,
                max_num_batched_tokens: 16,
                preemption_mode: PreemptionMode::Recompute,
            },
        };
        let mut e = Engine::new(exec, None, cfg).unwrap();
        for (i, prompt) in [vec![1, 2, 3], vec![9; 11], vec![4, 5]]
            .into_iter()
            .enumerate()
        {
            let p = SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(12)
            };
            e.add_request(i.to_string(), prompt, p).unwrap();
        }
        if with_sampled {
            let p = SamplingParams {
                seed: Some(3),
                max_tokens: Some(12),
                ..Default::default()
            };
            e.add_request("sampled", vec![6, 6], p).unwrap();
        }
        let mut done = Vec::new();
        while e.has_unfinished() {
            for out in e.step().unwrap() {
                if let Some(o) = out.outputs {
                    done.push((
                        out.request_id,
                        o[0].token_ids.clone(),
                        o[0].cumulative_logprob,
                    ));
                }
            }
        }
        done.sort_by(|a, b| a.0.cmp(&b.0));
        (done, e.stats().argmax_steps, e.stats().steps)
    };
    let (rows, none, _) = run(false, false);
    let (ids, argmax_steps, steps) = run(true, false);
    assert_eq!(none, 0);
    assert_eq!(ids, rows);
    assert_eq!(argmax_steps, steps, "every step was plain greedy");
    let (mixed_rows, _, _) = run(false, true);
    let (mixed, mixed_argmax, _) = run(true, true);
    assert_eq!(mixed, mixed_rows);
    assert!(
        mixed_argmax < argmax_steps,
        "steps with a sampled row read logits rows"
    );
}
