//! Parallel samples and beams over the simulated-KV executor: in crowded pools (preemption by
//! swap or recompute, chunked prefill, prefix caching) every request gets exactly what it gets
//! alone in a roomy pool, its cumulative logprobs are the model's, and sharing saves blocks.

use proptest::prelude::*;

use super::testing::{simulated_logits, FixedLogitsExecutor, SimulatedKvExecutor};
use super::*;
use crate::sampling::math::log_sum_exp;
use crate::scheduler::PreemptionMode;

const VOCAB: usize = 200;
const STOP: u32 = 7;
const MAX_MODEL_LEN: usize = 128;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Greedy,
    Samples { n: usize, best_of: usize },
    Beam { width: usize },
}

fn params(kind: Kind, max_tokens: usize, seed: u64) -> SamplingParams {
    let base = SamplingParams {
        max_tokens: Some(max_tokens),
        stop_token_ids: vec![STOP],
        seed: Some(seed),
        logprobs: Some(2),
        ..Default::default()
    };
    match kind {
        Kind::Greedy => SamplingParams {
            temperature: 0.0,
            ..base
        },
        Kind::Samples { n, best_of } => SamplingParams {
            n,
            best_of: Some(best_of),
            ..base
        },
        Kind::Beam { width } => SamplingParams {
            temperature: 0.0,
            n: width.min(2),
            best_of: Some(width),
            use_beam_search: true,
            ..base
        },
    }
}

#[allow(clippy::too_many_arguments)]
fn engine(
    bs: usize,
    blocks: usize,
    host: usize,
    seqs: usize,
    tokens: usize,
    mode: PreemptionMode,
    caching: bool,
) -> Engine<SimulatedKvExecutor> {
    let exec = SimulatedKvExecutor::new(VOCAB, bs, blocks, host);
    let config = EngineConfig {
        block_size: bs,
        num_device_blocks: blocks,
        num_host_blocks: host,
        max_model_len: MAX_MODEL_LEN,
        enable_prefix_caching: caching,
        scheduler: SchedulerConfig {
            max_num_seqs: seqs,
            max_num_batched_tokens: tokens,
            preemption_mode: mode,
        },
    };
    Engine::new(exec, None, config).unwrap()
}

type Spec = (Vec<u32>, usize, Kind, usize);

/// Runs the specs (prompt, max_tokens, kind, arrival step); returns each request's outputs.
fn run(
    e: &mut Engine<SimulatedKvExecutor>,
    specs: &[Spec],
    first_seed: u64,
) -> Vec<Vec<CompletionOutput>> {
    let mut got: Vec<Option<Vec<CompletionOutput>>> = vec![None; specs.len()];
    for step in 0..5_000 {
        for (i, (prompt, max_tokens, kind, arrival)) in specs.iter().enumerate() {
            if *arrival == step {
                let p = params(*kind, *max_tokens, first_seed + i as u64);
                e.add_request(i.to_string(), prompt.clone(), p).unwrap();
            }
        }
        for out in e.step().unwrap() {
            if let Some(outputs) = out.outputs {
                let i: usize = out.request_id.parse().unwrap();
                assert!(got[i].replace(outputs).is_none(), "finished twice");
            }
        }
        e.scheduler().check_invariants().unwrap();
        if got.iter().all(Option::is_some) {
            break;
        }
    }
    assert!(!e.has_unfinished(), "requests never finished");
    let bm = e.scheduler().block_manager();
    assert_eq!(bm.num_available_device(), bm.num_device_blocks());
    got.into_iter().map(|o| o.expect("unfinished")).collect()
}

/// The cumulative logprob of `out` recomputed from the simulated model's logits.
fn check_against_model(prompt: &[u32], out: &CompletionOutput) {
    let mut ctx = prompt.to_vec();
    let mut sum = 0.0;
    let mut row = vec![0f32; VOCAB];
    for (i, &t) in out.token_ids.iter().enumerate() {
        simulated_logits(&ctx, &mut row);
        let lp = row[t as usize] - log_sum_exp(&row);
        sum += lp as f64;
        let reported = &out.logprobs.as_ref().unwrap()[i];
        assert!(
            (reported.logprob - lp).abs() < 1e-4,
            "token {i}: {reported:?} vs {lp}"
        );
        ctx.push(t);
    }
    let cum = out.cumulative_logprob.unwrap();
    assert!((cum - sum).abs() < 1e-3, "{cum} vs {sum}");
}

fn kind_strategy() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Greedy),
        (1usize..3, 0usize..2).prop_map(|(n, extra)| Kind::Samples {
            n,
            best_of: n + extra
        }),
        (2usize..4).prop_map(|width| Kind::Beam { width }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn groups_in_a_crowded_pool_match_each_request_alone(
        specs in prop::collection::vec(
            (
                (0u32..2, prop::collection::vec(0u32..VOCAB as u32, 1..20)).prop_map(|(f, tail)| {
                    let mut p: Vec<u32> = (0..12).map(|i| 50 * f + i).collect();
                    p.extend(tail);
                    p
                }),
                1usize..20,
                kind_strategy(),
                0usize..6,
            ),
            1..7,
        ),
        block_size in prop::sample::select(vec![1usize, 2, 4, 8]),
        extra_blocks in 0usize..24,
        host_blocks in 0usize..60,
        max_num_seqs in 3usize..8,
        extra_tokens in 0usize..40,
        swap in any::<bool>(),
        prefix_caching in any::<bool>(),
        speculate in prop::option::of((1usize..5, 2u64..5)),
    ) {
        // Room for the largest request alone (the engine refuses what can never fit).
        let need = specs.iter().map(|(p, m, k, _)| {
            let width = match k { Kind::Greedy => 1, Kind::Samples { best_of, .. } => *best_of, Kind::Beam { width } => *width };
            let full = (p.len() + m).min(MAX_MODEL_LEN).div_ceil(block_size);
            full + (width - 1) * (full - p.len() / block_size)
        }).max().unwrap_or(1);
        let mode = if swap { PreemptionMode::Swap } else { PreemptionMode::Recompute };
        let mut crowded = engine(block_size, need + extra_blocks, host_blocks, max_num_seqs, max_num_seqs + extra_tokens, mode, prefix_caching);
        // With speculation (an erring proposer), greedy and beam requests must still match
        // their plain runs alone; sampled ones draw differently, but every token's logprob
        // must be the model's at its position.
        if let Some((k, one_in)) = speculate {
            let kind = super::tests::SpecKind::Erring { one_in };
            crowded.set_speculator(Some(super::spec_tests::speculator(kind, k, VOCAB, block_size)));
        }
        let together = run(&mut crowded, &specs, 0);
        for (i, spec) in specs.iter().enumerate() {
            let mut roomy = engine(4, 400, 0, 8, 512, PreemptionMode::Recompute, false);
            let alone = run(&mut roomy, &[(spec.0.clone(), spec.1, spec.2, 0)], i as u64).remove(0);
            let key = |o: &[CompletionOutput]| o.iter().map(|c| (c.token_ids.clone(), c.finish_reason)).collect::<Vec<_>>();
            if speculate.is_some() && matches!(spec.2, Kind::Samples { .. }) {
                for out in &together[i] {
                    check_against_model(&spec.0, out);
                }
                continue;
            }
            prop_assert_eq!(key(&together[i]), key(&alone), "request {} {:?}", i, spec.2);
            for out in &alone {
                check_against_model(&spec.0, out);
            }
        }
    }
}

#[test]
fn four_samples_share_the_prompt_blocks_until_they_write() {
    // A 100-token prompt in 16-token blocks: 6 full blocks and one with 4 tokens.
    let prompt: Vec<u32> = (0..100).map(|i| i % 150 + 10).collect();
    let mut e = engine(16, 64, 0, 8, 256, PreemptionMode::Recompute, false);
    let p = SamplingParams {
        n: 4,
        max_tokens: Some(8),
        ignore_eos: true,
        seed: Some(1),
        ..Default::default()
    };
    e.add_request("shared", prompt.clone(), p).unwrap();
    e.step().unwrap();
    // Prefilled once, four samples forked: 28 table entries on 7 blocks.
    assert_eq!(
        (e.stats().kv_blocks_logical, e.stats().kv_blocks_physical),
        (28, 7)
    );
    e.step().unwrap();
    // Each sample wrote its first token into the partly filled block: three copied it.
    assert_eq!(
        (e.stats().kv_blocks_logical, e.stats().kv_blocks_physical),
        (28, 10)
    );

    let mut separate = engine(16, 64, 0, 8, 512, PreemptionMode::Recompute, false);
    for i in 0..4 {
        let p = SamplingParams {
            max_tokens: Some(8),
            ignore_eos: true,
            ..Default::default()
        };
        separate
            .add_request(i.to_string(), prompt.clone(), p)
            .unwrap();
    }
    separate.step().unwrap();
    separate.step().unwrap();
    assert_eq!(separate.stats().kv_blocks_physical, 28);
}

#[test]
fn a_seeded_request_draws_the_same_whatever_its_neighbours() {
    let config = EngineConfig {
        block_size: 4,
        num_device_blocks: 256,
        num_host_blocks: 0,
        max_model_len: 64,
        enable_prefix_caching: false,
        scheduler: SchedulerConfig {
            max_num_seqs: 16,
            max_num_batched_tokens: 256,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    let p = SamplingParams {
        max_tokens: Some(24),
        ignore_eos: true,
        seed: Some(42),
        top_p: 0.9,
        n: 2,
        ..Default::default()
    };
    let tokens = |neighbours: usize| {
        let mut e = Engine::new(FixedLogitsExecutor::new(500, 3), None, config).unwrap();
        for i in 0..neighbours {
            let other = SamplingParams {
                max_tokens: Some(5 + i),
                temperature: 0.7,
                seed: Some(i as u64),
                ..Default::default()
            };
            e.add_request(format!("n{i}"), vec![3u32; 1 + i], other)
                .unwrap();
        }
        e.add_request("me", vec![5u32, 6, 7], p.clone()).unwrap();
        let done = e.generate(vec![], &[], &mut |_| {}).unwrap();
        assert!(done.is_empty());
        let mut mine = None;
        while e.has_unfinished() {
            for out in e.step().unwrap() {
                if out.request_id == "me" {
                    if let Some(o) = out.outputs {
                        mine = Some(o);
                    }
                }
            }
        }
        mine.unwrap()
            .into_iter()
            .map(|o| o.token_ids)
            .collect::<Vec<_>>()
    };
    let alone = tokens(0);
    assert_ne!(alone[0], alone[1], "two samples of one request differ");
    assert_eq!(tokens(5), alone);
    assert_eq!(tokens(11), alone);
}

#[test]
fn a_recomputed_group_comes_back_sharing_its_prefix() {
    // Found by the property test: without swap space, a preempted 2-sample group recomputed
    // member by member in 10-token chunks needed more blocks than the pool had (the second
    // member only shared what the first had computed in its first step), forever.
    let specs: Vec<Spec> = vec![
        ((0..12).chain([0]).collect(), 15, Kind::Greedy, 0),
        (
            (0..12).chain([0, 46, 2, 3, 0, 4, 0, 0, 0, 0]).collect(),
            7,
            Kind::Samples { n: 1, best_of: 2 },
            0,
        ),
    ];
    let mut e = engine(1, 37, 0, 6, 10, PreemptionMode::Recompute, false);
    let together = run(&mut e, &specs, 0);
    assert!(e.stats().preemptions > 0);
    for (i, spec) in specs.iter().enumerate() {
        let mut roomy = engine(4, 400, 0, 8, 512, PreemptionMode::Recompute, false);
        let alone = run(&mut roomy, std::slice::from_ref(spec), i as u64);
        assert_eq!(together[i], alone[0]);
    }
}
