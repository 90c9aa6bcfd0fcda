//! Speculative decoding over the simulated-KV executor: greedy output is the plain output
//! whatever the proposer and preemption do, sampled output keeps the target's distribution,
//! and every block comes back. (The property test in `tests.rs` runs with proposers too.)

use std::cell::Cell;
use std::rc::Rc;
use std::task::Poll;

use super::testing::{simulated_next_token, SimulatedKvExecutor};
use super::tests::{crowded_with, SpecKind};
use super::*;
use crate::scheduler::{CacheOps, PreemptionMode};
use crate::spec_decode::{
    DraftProposer, NgramProposer, Proposal, ProposalRequest, Proposer, Round, SpeculativeConfig,
};

/// Proposes the simulated model's own next tokens, but gets one in `one_in` wrong (chosen by
/// a hash of the position, so runs are reproducible).
struct ErringProposer {
    vocab: usize,
    one_in: u64,
}

impl Proposer for ErringProposer {
    fn begin(&mut self, requests: &[ProposalRequest]) -> Result<Round> {
        Ok(Round::Done(
            requests
                .iter()
                .map(|r| {
                    let mut ctx = r.tokens.to_vec();
                    for _ in 0..r.max_tokens {
                        let mut t = simulated_next_token(&ctx, self.vocab);
                        let h = simulated_next_token(&ctx, 1 << 20) as u64;
                        if h.is_multiple_of(self.one_in) {
                            t = (t + 1) % self.vocab as u32;
                        }
                        ctx.push(t);
                    }
                    Proposal::deterministic(ctx[r.tokens.len()..].to_vec())
                })
                .collect(),
        ))
    }

    fn name(&self) -> &'static str {
        "erring"
    }
}

/// A speculator that stays on at any batch size.
pub(super) fn speculator(kind: SpecKind, k: usize, vocab: usize, block_size: usize) -> Speculator {
    let proposer: Box<dyn Proposer> = match kind {
        SpecKind::Ngram => Box::new(NgramProposer::new(1, 3)),
        SpecKind::Erring { one_in } => Box::new(ErringProposer { vocab, one_in }),
        SpecKind::Draft { num_blocks } => {
            let exec = SimulatedKvExecutor::new(vocab, block_size, num_blocks, 0);
            Box::new(DraftProposer::new(exec, block_size, num_blocks))
        }
    };
    let config = SpeculativeConfig {
        method: Some("ngram".into()),
        num_speculative_tokens: k,
        disable_by_batch_size: Some(usize::MAX),
        ..Default::default()
    };
    Speculator::new(proposer, &config).unwrap()
}

#[test]
fn greedy_output_survives_rejections_and_preemption() {
    let (plain, _, _) = crowded_with(PreemptionMode::Recompute, None);
    assert!(plain > 0);
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        // `crowded_with` checks every request's tokens against the plain greedy chain.
        let (preempted, _, stats) = crowded_with(mode, Some((SpecKind::Erring { one_in: 3 }, 4)));
        let s = stats.spec;
        assert!(preempted > 0, "{mode:?}");
        assert!(s.num_drafts > 0 && s.num_accepted_tokens > 0, "{s:?}");
        assert!(s.num_accepted_tokens < s.num_draft_tokens, "{s:?}");
        assert!(
            s.accepted_per_position[0] >= s.accepted_per_position[3],
            "{s:?}"
        );
        let (_, _, stats) = crowded_with(mode, Some((SpecKind::Draft { num_blocks: 64 }, 3)));
        assert!(stats.spec.num_accepted_tokens > 0, "{:?}", stats.spec);
    }
}

fn engine(vocab: usize, spec: Option<Speculator>) -> Engine<SimulatedKvExecutor> {
    let exec = SimulatedKvExecutor::new(vocab, 4, 256, 0);
    let config = EngineConfig {
        block_size: 4,
        num_device_blocks: 256,
        num_host_blocks: 0,
        max_model_len: 128,
        enable_prefix_caching: true,
        scheduler: SchedulerConfig {
            max_num_seqs: 16,
            max_num_batched_tokens: 256,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    let mut e = Engine::new(exec, None, config).unwrap();
    e.set_speculator(spec);
    e
}

fn finish(e: &mut Engine<SimulatedKvExecutor>) -> HashMap<String, Vec<CompletionOutput>> {
    let mut done = HashMap::new();
    while e.has_unfinished() {
        for out in e.step().unwrap() {
            if let Some(o) = out.outputs {
                done.insert(out.request_id, o);
            }
        }
        e.scheduler().check_invariants().unwrap();
    }
    let bm = e.scheduler().block_manager();
    assert_eq!(bm.num_available_device(), bm.num_device_blocks());
    done
}

#[test]
fn a_perfect_draft_is_always_accepted_and_max_tokens_cuts_inside_a_run() {
    let mut e = engine(
        500,
        Some(speculator(SpecKind::Draft { num_blocks: 256 }, 5, 500, 4)),
    );
    for max_tokens in 1..12 {
        let p = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(max_tokens)
        };
        e.add_request(max_tokens.to_string(), vec![3, 1, 4, 1, 5], p)
            .unwrap();
    }
    let done = finish(&mut e);
    for max_tokens in 1..12 {
        let got = &done[&max_tokens.to_string()][0];
        assert_eq!(got.token_ids.len(), max_tokens);
        let mut ctx = vec![3, 1, 4, 1, 5];
        for &t in &got.token_ids {
            assert_eq!(t, simulated_next_token(&ctx, 500));
            ctx.push(t);
        }
    }
    let s = e.stats().spec;
    assert_eq!(s.num_accepted_tokens, s.num_draft_tokens, "{s:?}");
    assert_eq!(
        s.mean_acceptance_length(),
        Some(1.0 + s.num_accepted_tokens as f64 / s.num_drafts as f64)
    );
    assert!(s.num_drafts > 0);
}

#[test]
fn seeded_sampling_with_speculation_is_reproducible_and_n_and_beams_are_handled() {
    let run = |spec: Option<SpecKind>| {
        let s = spec.map(|kind| speculator(kind, 3, 300, 4));
        let mut e = engine(300, s);
        let sampled = SamplingParams {
            seed: Some(11),
            n: 3,
            temperature: 0.7,
            ignore_eos: true,
            max_tokens: Some(20),
            logprobs: Some(2),
            ..Default::default()
        };
        e.add_request("sampled", vec![5, 6, 7], sampled).unwrap();
        let beams = SamplingParams {
            use_beam_search: true,
            n: 2,
            ignore_eos: true,
            ..SamplingParams::greedy(10)
        };
        e.add_request("beams", vec![8, 9], beams).unwrap();
        let done = finish(&mut e);
        (done, e.stats().spec)
    };
    let (plain, _) = run(None);
    let draft = SpecKind::Draft { num_blocks: 256 };
    for kind in [SpecKind::Erring { one_in: 4 }, draft] {
        let (a, stats) = run(Some(kind));
        let (b, _) = run(Some(kind));
        assert_eq!(
            a["sampled"], b["sampled"],
            "{kind:?}: same seed, same output"
        );
        assert_eq!(a["sampled"].len(), 3);
        for o in &a["sampled"] {
            assert_eq!(o.token_ids.len(), 20);
            assert_eq!(o.logprobs.as_ref().map(Vec::len), Some(20));
        }
        assert!(stats.num_drafts > 0, "the samples speculated: {stats:?}");
        assert_eq!(a["beams"], plain["beams"], "beam search does not speculate");
        if let SpecKind::Draft { .. } = kind {
            // The draft is the target's own model sampling at its temperature: q = p, so
            // min(1, p/q) keeps (nearly) every proposal.
            let rate = stats.acceptance_rate().unwrap();
            assert!(rate > 0.97, "{stats:?}");
        }
    }
}

/// The same logits at every position: a small vocabulary whose distribution is known.
struct FixedRowExecutor {
    row: Vec<f32>,
}

impl Executor for FixedRowExecutor {
    fn vocab_size(&self) -> usize {
        self.row.len()
    }

    fn submit(
        &mut self,
        _ops: &crate::scheduler::CacheOps,
        batch: Option<&crate::batch::BatchInput>,
    ) -> Result<PendingLogits> {
        let mut step = StepLogits::default();
        for _ in batch.map_or(&[][..], |b| &b.logits_indices[..]) {
            step.rows.extend(&self.row);
        }
        Ok(PendingLogits::Ready(step))
    }
}

/// Always proposes the same token, or samples from a fixed q with the request's uniforms.
enum TestProposer {
    Constant(u32),
    Sampled(Vec<f32>),
}

impl Proposer for TestProposer {
    fn begin(&mut self, requests: &[ProposalRequest]) -> Result<Round> {
        Ok(Round::Done(
            requests
                .iter()
                .map(|r| match self {
                    TestProposer::Constant(t) => Proposal::deterministic(vec![*t; r.max_tokens]),
                    TestProposer::Sampled(q) => {
                        assert_eq!(r.uniforms.len(), r.max_tokens, "a uniform per proposal");
                        let tokens = r
                            .uniforms
                            .iter()
                            .map(|&u| {
                                let mut acc = 0.0;
                                let at = q.iter().position(|&p| {
                                    acc += p as f64;
                                    acc > u
                                });
                                at.unwrap_or(q.len() - 1) as u32
                            })
                            .collect();
                        Proposal {
                            tokens,
                            probs: q.repeat(r.max_tokens),
                        }
                    }
                })
                .collect(),
        ))
    }

    fn name(&self) -> &'static str {
        "test"
    }
}

/// Rejection sampling keeps the target's distribution: the second token of 4000 seeded
/// requests (the first one a proposal verifies) against temperature 0.8 and top-k 5 over a
/// 6-token vocabulary, by a chi-square test. The proposals: a likely token, an unlikely one,
/// one top-k removes (q one-hot), and draws from a q unlike p that puts mass on the removed
/// token. The acceptance rate is the sum of min(p, q), as rejection sampling promises.
#[test]
fn verified_tokens_follow_the_target_distribution() {
    let row = vec![1.0f32, 0.2, 2.0, -0.5, 0.7, -3.0];
    let (temperature, top_k) = (0.8f32, 5);
    let weights: Vec<f64> = row
        .iter()
        .map(|&l| ((l as f64 - 2.0) / temperature as f64).exp())
        .collect();
    let total: f64 = weights.iter().take(5).sum::<f64>();
    let p: Vec<f64> = (0..6)
        .map(|t| if t == 5 { 0.0 } else { weights[t] / total })
        .collect();
    const N: u64 = 4000;
    let proposers = [
        TestProposer::Constant(2),
        TestProposer::Constant(3),
        TestProposer::Constant(5),
        TestProposer::Sampled(vec![0.05, 0.05, 0.1, 0.4, 0.2, 0.2]),
    ];
    for proposer in proposers {
        let (name, expected_acceptance) = match &proposer {
            TestProposer::Constant(x) => (format!("constant {x}"), p[*x as usize]),
            TestProposer::Sampled(q) => {
                let overlap = (0..6).map(|t| p[t].min(q[t] as f64)).sum();
                ("sampled".to_string(), overlap)
            }
        };
        let config = SpeculativeConfig {
            method: Some("ngram".into()),
            num_speculative_tokens: 1,
            disable_by_batch_size: Some(usize::MAX),
            ..Default::default()
        };
        let spec = Speculator::new(Box::new(proposer), &config).unwrap();
        let exec = FixedRowExecutor { row: row.clone() };
        let mut e = Engine::new(
            exec,
            None,
            EngineConfig {
                block_size: 4,
                num_device_blocks: 4096,
                num_host_blocks: 0,
                max_model_len: 16,
                enable_prefix_caching: false,
                scheduler: SchedulerConfig {
                    max_num_seqs: 256,
                    max_num_batched_tokens: 2048,
                    preemption_mode: PreemptionMode::Recompute,
                },
            },
        )
        .unwrap();
        e.set_speculator(Some(spec));
        for seed in 0..N {
            let params = SamplingParams {
                seed: Some(seed),
                temperature,
                top_k,
                ignore_eos: true,
                max_tokens: Some(2),
                ..Default::default()
            };
            e.add_request(seed.to_string(), vec![1, 2], params).unwrap();
        }
        let mut counts = [0u64; 6];
        while e.has_unfinished() {
            for out in e.step().unwrap() {
                if let Some(o) = out.outputs {
                    counts[o[0].token_ids[1] as usize] += 1;
                }
            }
        }
        let s = e.stats().spec;
        assert_eq!(s.num_drafts, N, "every second token was verified");
        assert_eq!(counts[5], 0, "top-k removed token 5");
        let chi2: f64 = (0..5)
            .map(|t| {
                let want = p[t] * N as f64;
                (counts[t] as f64 - want).powi(2) / want
            })
            .sum();
        // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
        assert!(chi2 < 18.47, "{name}: {counts:?} vs {p:?}: chi2 {chi2}");
        let accepted = s.num_accepted_tokens as f64 / N as f64;
        assert!(
            (accepted - expected_acceptance).abs() < 0.03,
            "{name}: accepted {accepted} vs {expected_acceptance}"
        );
    }
}

/// An executor whose read-backs complete only after the caller has come back once, as the
/// browser's mapped buffers do; counts the read-backs that were still pending when polled.
struct DeferredReadback {
    inner: SimulatedKvExecutor,
    pending: Rc<Cell<usize>>,
}

impl Executor for DeferredReadback {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn submit(&mut self, ops: &CacheOps, batch: Option<&BatchInput>) -> Result<PendingLogits> {
        let mut logits = Some(self.inner.submit(ops, batch)?.wait(|| Ok(()))?);
        let pending = self.pending.clone();
        let mut polled = false;
        Ok(PendingLogits::InFlight(Box::pin(std::future::poll_fn(
            move |cx| {
                if !polled {
                    polled = true;
                    pending.set(pending.get() + 1);
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Ready(
                    logits
                        .take()
                        .ok_or_else(|| InferError::invalid("poll", "twice")),
                )
            },
        ))))
    }
}

#[test]
fn a_draft_model_read_back_asynchronously_drafts_the_same_under_step_async() {
    // `step` blocks on the draft's forwards, `step_async` awaits them (the browser's loop):
    // the same proposals, accepted the same, the same outputs.
    let run = |asynchronous: bool| {
        let pending = Rc::new(Cell::new(0));
        let draft = DeferredReadback {
            inner: SimulatedKvExecutor::new(500, 4, 256, 0),
            pending: pending.clone(),
        };
        let config = SpeculativeConfig {
            method: Some("draft_model".into()),
            model: Some("draft".into()),
            num_speculative_tokens: 4,
            disable_by_batch_size: Some(usize::MAX),
            ..Default::default()
        };
        let proposer = Box::new(DraftProposer::new(draft, 4, 256));
        let mut e = engine(500, Some(Speculator::new(proposer, &config).unwrap()));
        for (i, prompt) in [vec![3, 1, 4], vec![2, 7, 1, 8, 2, 8], vec![1, 6, 1, 8]]
            .into_iter()
            .enumerate()
        {
            let p = SamplingParams {
                ignore_eos: true,
                seed: Some(i as u64),
                temperature: if i == 2 { 0.8 } else { 0.0 },
                ..SamplingParams::greedy(9)
            };
            e.add_request(i.to_string(), prompt, p).unwrap();
        }
        let mut done = HashMap::new();
        while e.has_unfinished() {
            let outs = if asynchronous {
                pollster::block_on(e.step_async()).unwrap()
            } else {
                e.step().unwrap()
            };
            for out in outs {
                if let Some(o) = out.outputs {
                    done.insert(out.request_id, o[0].token_ids.clone());
                }
            }
        }
        (done, e.stats().spec, pending.get())
    };
    let (blocking, mut blocking_stats, _) = run(false);
    let (awaited, mut awaited_stats, pending) = run(true);
    assert_eq!(blocking, awaited);
    (blocking_stats.propose_micros, awaited_stats.propose_micros) = (0, 0);
    assert_eq!(blocking_stats, awaited_stats);
    assert!(awaited_stats.num_drafts > 0 && awaited_stats.num_accepted_tokens > 0);
    assert!(pending > 0, "the draft's read-backs were awaited");
}
