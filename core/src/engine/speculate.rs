//! Speculative decoding in the engine: proposals before each step, the verification rounds
//! after it, and the roll-back of what the target rejected.

use std::collections::HashMap;

use web_time::Instant;

use super::process::{Job, SpecCursor};
use super::request::Request;
use super::{Engine, Executor, RequestOutput};
use crate::block_manager::SeqId;
use crate::error::Result;
use crate::scheduler::ScheduledChunk;
use crate::spec_decode::{ProposalRequest, Speculator};

impl<E: Executor> Engine<E> {
    /// Speculates with `speculator` from the next step on (`None` turns it off).
    pub fn set_speculator(&mut self, speculator: Option<Speculator>) {
        self.speculator = speculator;
    }

    pub fn speculator(&self) -> Option<&Speculator> {
        self.speculator.as_ref()
    }

    /// Gives every decoding sequence its proposals for the coming step (or none: beam search,
    /// no room left before `max_tokens`, or a batch too large for speculation to pay).
    pub(super) fn propose(&mut self) -> Result<()> {
        let Some(spec) = self.speculator.as_mut() else {
            return Ok(());
        };
        let started = Instant::now();
        let scheduler = &self.scheduler;
        spec.proposer.retain(&|seq| scheduler.seq(seq).is_some());
        let running = scheduler.num_running();
        let enabled = running < spec.disable_by_batch_size;
        if !enabled {
            self.stats.spec.disabled_steps += 1;
        }
        self.spec_probs.clear();
        // (sequence, its tokens, k, temperature, one uniform per proposal when sampled)
        let mut wanted = Vec::new();
        let mut quiet = Vec::new();
        for (seq, s) in scheduler.running() {
            if s.num_computed + 1 != s.tokens.len() {
                continue;
            }
            let owner = self.owners.get(&seq).and_then(|k| self.requests.get_mut(k));
            let Some(req) =
                owner.filter(|r| enabled && !r.params.use_beam_search && !r.before_first_token())
            else {
                if !s.spec.is_empty() {
                    quiet.push(seq);
                }
                continue;
            };
            let k = spec
                .num_speculative_tokens
                .min(req.max_len.saturating_sub(s.tokens.len()));
            let member = req.members.iter_mut().find(|m| m.seq == Some(seq));
            let (Some(member), true) = (member, k > 0) else {
                quiet.push(seq);
                continue;
            };
            let greedy = req.params.is_greedy();
            let temperature = if greedy { 0.0 } else { req.params.temperature };
            let draws = if greedy { 0 } else { k };
            let uniforms: Vec<f64> = (0..draws)
                .map(|_| rand::Rng::random(&mut member.rng))
                .collect();
            wanted.push((seq, &s.tokens[..], k, temperature, uniforms));
        }
        let asks: Vec<ProposalRequest> = wanted
            .iter()
            .map(|(seq, tokens, k, temperature, uniforms)| ProposalRequest {
                seq: *seq,
                tokens,
                max_tokens: *k,
                temperature: *temperature,
                uniforms,
            })
            .collect();
        let proposals = if asks.is_empty() {
            Vec::new()
        } else {
            spec.proposer.propose(&asks)?
        };
        let vocab = self.executor.vocab_size();
        let mut given = Vec::with_capacity(asks.len());
        for (a, mut p) in asks.iter().zip(proposals) {
            p.tokens.truncate(a.max_tokens);
            if !p.probs.is_empty() {
                if p.probs.len() < p.tokens.len() * vocab {
                    return Err(crate::error::InferError::Backend {
                        backend: spec.proposer.name(),
                        message: format!(
                            "{} proposals but {} probabilities (vocabulary {vocab})",
                            p.tokens.len(),
                            p.probs.len()
                        ),
                    });
                }
                self.spec_probs.insert(a.seq, p.probs);
            }
            given.push((a.seq, p.tokens));
        }
        drop(asks);
        drop(wanted);
        for (seq, p) in given {
            self.scheduler.set_proposals(seq, p);
        }
        for seq in quiet {
            self.scheduler.set_proposals(seq, Vec::new());
        }
        self.stats.spec.propose_micros += started.elapsed().as_micros() as u64;
        Ok(())
    }

    /// The next round's jobs: each speculating row whose proposal was drawn moves on to the
    /// next position (the bonus row after the last proposal) while its sequence lives.
    pub(super) fn next_spec_jobs(
        &mut self,
        jobs: Vec<Job>,
        tokens: &[u32],
        accepted: &mut HashMap<SeqId, usize>,
    ) -> Vec<Job> {
        let mut next = Vec::new();
        for (job, &token) in jobs.into_iter().zip(tokens) {
            let Some(mut cursor) = job.spec else {
                continue;
            };
            if cursor.proposals.get(cursor.position) != Some(&token) {
                continue;
            }
            self.stats.spec.num_accepted_tokens += 1;
            if let Some(n) = self
                .stats
                .spec
                .accepted_per_position
                .get_mut(cursor.position)
            {
                *n += 1;
            }
            *accepted.entry(cursor.seq).or_default() += 1;
            let Some(req) = self.requests.get_mut(&job.key) else {
                continue;
            };
            let Some(member) = req
                .members
                .iter()
                .position(|m| m.seq == Some(cursor.seq) && m.finish.is_none())
            else {
                continue;
            };
            cursor.position += 1;
            next.push(spec_job(job.key, req, member, job.row + 1, cursor));
        }
        next
    }

    /// Rolls each speculating sequence still alive back to its verified tokens: the known
    /// ones plus the accepted proposals (the token drawn after them has no K/V yet).
    pub(super) fn finish_speculation(
        &mut self,
        chunks: &[ScheduledChunk],
        accepted: &HashMap<SeqId, usize>,
    ) -> Result<()> {
        for c in chunks.iter().filter(|c| c.num_spec > 0) {
            if self.scheduler.seq(c.seq).is_none() {
                continue;
            }
            let known = c.num_computed + c.num_new - c.num_spec;
            let n = accepted.get(&c.seq).copied().unwrap_or(0);
            self.scheduler.finish_speculation(c.seq, known + n)?;
        }
        Ok(())
    }
}

/// The job verifying `spec`'s current position from logits row `row`. A random row takes
/// two uniforms while it verifies a proposal (accept, then the residual draw) and one for the
/// bonus draw; a greedy row one, as always.
pub(super) fn spec_job(
    key: u64,
    req: &mut Request,
    member: usize,
    row: usize,
    spec: SpecCursor,
) -> Job {
    let verifying = spec.position < spec.proposals.len();
    let draws = if verifying && !req.params.is_greedy() {
        2
    } else {
        1
    };
    let rng = &mut req.members[member].rng;
    let uniforms = (0..draws).map(|_| rand::Rng::random(rng)).collect();
    Job {
        key,
        member,
        row,
        uniforms,
        spec: Some(spec),
    }
}

/// A step's outputs, one per request: a speculating request's later rounds merge into it.
#[derive(Default)]
pub(super) struct StepOutputs {
    outputs: Vec<RequestOutput>,
    /// Built at the second round (steps without speculation never pay for it).
    index: Option<HashMap<String, usize>>,
}

impl StepOutputs {
    /// Outputs from now on may belong to requests that already have one.
    pub fn start_merging(&mut self) {
        if self.index.is_none() {
            let index = self.outputs.iter().enumerate();
            self.index = Some(index.map(|(i, o)| (o.request_id.clone(), i)).collect());
        }
    }

    pub fn push(&mut self, out: RequestOutput) {
        let Some(index) = self.index.as_mut() else {
            self.outputs.push(out);
            return;
        };
        let Some(&i) = index.get(&out.request_id) else {
            index.insert(out.request_id.clone(), self.outputs.len());
            self.outputs.push(out);
            return;
        };
        let prev = &mut self.outputs[i];
        for d in out.deltas {
            match prev.deltas.iter_mut().find(|p| p.index == d.index) {
                Some(p) => {
                    p.new_token_ids.extend(d.new_token_ids);
                    p.text_delta.push_str(&d.text_delta);
                    p.logprobs.extend(d.logprobs);
                    p.finish_reason = d.finish_reason;
                    p.stop_reason = d.stop_reason;
                }
                None => prev.deltas.push(d),
            }
        }
        prev.outputs = out.outputs;
        prev.prompt_logprobs = out.prompt_logprobs.or(prev.prompt_logprobs.take());
        prev.metrics = out.metrics;
    }

    pub fn into_vec(self) -> Vec<RequestOutput> {
        self.outputs
    }
}
