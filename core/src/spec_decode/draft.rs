//! A draft model: a smaller model with the target's tokenizer, run by its own executor over
//! its own KV pool and block tables. Each step it catches up on the tokens the target accepted
//! since its last proposal (only those: the cache keeps every position both models agree on),
//! then decodes k tokens in k batched forwards: greedily for greedy requests, and for sampled
//! ones by drawing from softmax(logits / T) at the request's temperature, reporting that q.

use std::collections::HashMap;

use super::{Proposal, ProposalRequest, Proposer, Round};
use crate::backend::StepLogits;
use crate::batch::{BatchInput, SequenceChunk};
use crate::block_manager::{BlockManager, PrefixHit, SeqId};
use crate::engine::Executor;
use crate::error::BackendError;
use crate::error::{InferError, Result};
use crate::narrow::{f32_of, u32_index};
use crate::sampling::math::argmax;
use crate::scheduler::CacheOps;

pub struct DraftProposer<E: Executor> {
    executor: E,
    blocks: BlockManager,
    /// Per sequence, the tokens whose K/V the draft cache holds (in position order).
    cached: HashMap<SeqId, Vec<u32>>,
    block_size: usize,
    /// The round in progress (`begin` to `Round::Done`).
    round: Option<DraftRound>,
}

/// A round of proposals between its forwards.
struct DraftRound {
    drafting: Vec<Drafting>,
    num_requests: usize,
    /// Forwards done; the next one feeds every sequence that wants more than this many.
    done: usize,
    /// Forwards in all: the most proposals any sequence wants.
    rounds: usize,
}

/// One sequence being drafted this step.
struct Drafting {
    /// Index into the requests.
    request: usize,
    seq: SeqId,
    /// The sequence's own tokens (the proposals follow them in `tokens`).
    known: usize,
    /// Tokens fed so far (the sequence's, then the draft's own).
    tokens: Vec<u32>,
    /// How many of `tokens` have K/V in the draft cache.
    computed: usize,
    wanted: usize,
    temperature: f32,
    uniforms: Vec<f64>,
    /// q of each sampled proposal, `[vocab]` per proposal.
    probs: Vec<f32>,
}

impl<E: Executor> DraftProposer<E> {
    /// `executor` holds `num_blocks` KV blocks of `block_size` tokens for the draft model.
    pub fn new(executor: E, block_size: usize, num_blocks: usize) -> Self {
        DraftProposer {
            executor,
            blocks: BlockManager::new(block_size, num_blocks, 0, false),
            cached: HashMap::new(),
            block_size,
            round: None,
        }
    }

    fn forget(&mut self, seq: SeqId) {
        self.blocks.free(seq);
        self.cached.remove(&seq);
    }

    /// Rolls the sequence's draft cache back to what still matches `r.tokens` and makes
    /// room for the catch-up and the proposals; `None` when the draft pool is full (the
    /// sequence goes without proposals this step).
    fn prepare(&mut self, request: usize, r: &ProposalRequest) -> Result<Option<Drafting>> {
        let len = r.tokens.len();
        let cached = self.cached.get(&r.seq).map_or(&[][..], Vec::as_slice);
        let common = cached
            .iter()
            .zip(r.tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(len - 1);
        if self.blocks.block_table(r.seq).is_some() {
            self.blocks.truncate(r.seq, r.tokens, common)?;
        } else {
            self.blocks
                .allocate(r.seq, PrefixHit::default(), r.tokens, 0)?;
        }
        let grown = self.blocks.append_speculative_slots(
            r.seq,
            r.tokens,
            common,
            len - common,
            r.max_tokens - 1,
        )?;
        if grown.is_none() {
            self.forget(r.seq);
            return Ok(None);
        }
        self.cached.insert(r.seq, r.tokens[..common].to_vec());
        Ok(Some(Drafting {
            request,
            seq: r.seq,
            known: len,
            tokens: r.tokens.to_vec(),
            computed: common,
            wanted: r.max_tokens,
            temperature: r.temperature,
            uniforms: r.uniforms.to_vec(),
            probs: Vec::new(),
        }))
    }

    /// Each sequence of the forward gets its next token from the forward's logits.
    fn absorb(&self, drafting: &mut [&mut Drafting], logits: StepLogits) -> Result<()> {
        let vocab = self.executor.vocab_size().max(1);
        let rows = match &logits.argmax {
            Some(ids) => ids.len(),
            None => logits.rows.len() / vocab,
        };
        if rows != drafting.len() {
            return Err(
                BackendError::count("draft forward", "logit rows", rows, drafting.len())
                    .on("draft model"),
            );
        }
        for (i, d) in drafting.iter_mut().enumerate() {
            let id = match &logits.argmax {
                Some(ids) => ids[i],
                None if d.temperature <= 0.0 => argmax(&logits.rows[i * vocab..(i + 1) * vocab]),
                None => {
                    let row = &logits.rows[i * vocab..(i + 1) * vocab];
                    // One uniform per sampled proposal, in order.
                    let u = d
                        .uniforms
                        .get(d.probs.len() / vocab)
                        .copied()
                        .unwrap_or(0.0);
                    draw_with_q(row, d.temperature, u, &mut d.probs)
                }
            };
            d.computed = d.tokens.len();
            d.tokens.push(id);
        }
        Ok(())
    }
}

/// Draws from softmax(`row` / `temperature`) by inverse CDF at `u`; appends that
/// distribution to `q`.
fn draw_with_q(row: &[f32], temperature: f32, u: f64, q: &mut Vec<f32>) -> u32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let start = q.len();
    q.extend(row.iter().map(|&l| ((l - max) / temperature).exp()));
    let dist = &mut q[start..];
    let total: f64 = dist.iter().map(|&w| w as f64).sum();
    if !(total.is_finite() && total > 0.0) {
        // Nothing drawable: a one-hot q on the argmax keeps the verification exact.
        let best = argmax(row);
        dist.iter_mut().for_each(|w| *w = 0.0);
        dist[best as usize] = 1.0;
        return best;
    }
    let target = u * total;
    let mut acc = 0.0;
    let mut token = None;
    for (t, w) in dist.iter_mut().enumerate() {
        acc += *w as f64;
        if token.is_none() && acc > target && *w > 0.0 {
            token = Some(u32_index(t));
        }
        *w = f32_of(*w as f64 / total);
    }
    token.unwrap_or_else(|| u32_index(dist.iter().rposition(|&w| w > 0.0).unwrap_or(0)))
}

impl<E: Executor> DraftProposer<E> {
    /// The round's next forward, or its proposals once every sequence has its tokens.
    fn next(&mut self) -> Result<Round> {
        let Some(round) = self.round.as_mut() else {
            return Ok(Round::Done(Vec::new()));
        };
        if round.done < round.rounds {
            let active = round.drafting.iter().filter(|d| d.wanted > round.done);
            let chunks: Vec<SequenceChunk> = active
                .clone()
                .map(|d| SequenceChunk {
                    tokens: &d.tokens[d.computed..],
                    num_computed: d.computed,
                    block_table: self.blocks.block_table(d.seq).unwrap_or(&[]),
                    want_logits: true,
                    all_logits: false,
                })
                .collect();
            let read = BatchInput::build(&chunks, self.block_size).and_then(|mut batch| {
                batch.argmax_only = active.clone().all(|d| d.temperature <= 0.0);
                self.executor.submit(&CacheOps::default(), Some(&batch))
            });
            return match read {
                Ok(read) => Ok(Round::Forward(read)),
                Err(e) => Err(self.abandon(e)),
            };
        }
        let Some(round) = self.round.take() else {
            return Ok(Round::Done(Vec::new()));
        };
        let mut out = vec![Proposal::default(); round.num_requests];
        for d in round.drafting {
            let tokens = d.tokens[d.known..].to_vec();
            // The last proposal was never fed back: the cache ends before it.
            self.cached
                .insert(d.seq, d.tokens[..d.tokens.len() - 1].to_vec());
            out[d.request] = Proposal {
                tokens,
                probs: d.probs,
            };
        }
        Ok(Round::Done(out))
    }

    /// Ends a failed round: the cache may hold half a step, so every sequence of the round
    /// starts over next time.
    fn abandon(&mut self, e: InferError) -> InferError {
        if let Some(round) = self.round.take() {
            round.drafting.iter().for_each(|d| self.forget(d.seq));
        }
        e
    }
}

impl<E: Executor> Proposer for DraftProposer<E> {
    fn begin(&mut self, requests: &[ProposalRequest]) -> Result<Round> {
        if let Some(stale) = self.round.take() {
            // A round left unfinished (its caller failed): its cache state is unknown.
            stale.drafting.iter().for_each(|d| self.forget(d.seq));
        }
        let mut drafting = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            if r.max_tokens == 0 || r.tokens.is_empty() {
                continue;
            }
            if let Some(d) = self.prepare(i, r)? {
                drafting.push(d);
            }
        }
        let rounds = drafting.iter().map(|d| d.wanted).max().unwrap_or(0);
        self.round = Some(DraftRound {
            drafting,
            num_requests: requests.len(),
            done: 0,
            rounds,
        });
        self.next()
    }

    fn resume(&mut self, logits: Result<StepLogits>) -> Result<Round> {
        let logits = match logits {
            Ok(l) => l,
            Err(e) => return Err(self.abandon(e)),
        };
        let Some(mut round) = self.round.take() else {
            return Err(InferError::invalid(
                "speculative_config",
                "the draft model got logits with no round in progress",
            ));
        };
        let done = round.done;
        let mut active: Vec<&mut Drafting> = round
            .drafting
            .iter_mut()
            .filter(|d| d.wanted > done)
            .collect();
        let absorbed = self.absorb(&mut active, logits);
        round.done += 1;
        self.round = Some(round);
        match absorbed {
            Ok(()) => self.next(),
            Err(e) => Err(self.abandon(e)),
        }
    }

    fn wait_device(&self) -> Result<()> {
        self.executor.wait()
    }

    fn retain(&mut self, live: &dyn Fn(SeqId) -> bool) {
        let gone: Vec<SeqId> = self.cached.keys().copied().filter(|&s| !live(s)).collect();
        gone.into_iter().for_each(|s| self.forget(s));
    }

    fn name(&self) -> &'static str {
        "draft_model"
    }
}
