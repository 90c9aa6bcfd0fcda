//! Speculative decoding in the engine: proposals before each step, the verification rounds
//! after it, and the roll-back of what the target rejected.

use std::collections::HashMap;

use web_time::Instant;

use super::job::{spec_job, Job};
use super::request::Request;
use super::{Engine, EngineStats, Executor};
use crate::block_manager::SeqId;
use crate::error::Result;
use crate::narrow::u64_saturating;
use crate::scheduler::{ScheduledChunk, Scheduler};
use crate::spec_decode::{
    propose_awaiting, propose_blocking, Proposal, ProposalRequest, Speculator,
};

impl<E: Executor> Engine<E> {
    /// Speculates with `speculator` from the next step on (`None` turns it off).
    pub fn set_speculator(&mut self, speculator: Option<Speculator>) {
        self.speculator = speculator;
    }

    pub fn speculator(&self) -> Option<&Speculator> {
        self.speculator.as_ref()
    }

    /// Gives every decoding sequence its proposals for the coming step (or none: beam search,
    /// no room left before `max_tokens`, or a batch too large for speculation to pay),
    /// blocking on a draft model's forwards.
    pub(super) fn propose(&mut self) -> Result<()> {
        let Some(spec) = self.speculator.as_mut() else {
            return Ok(());
        };
        self.spec_probs.clear();
        let round =
            ProposalRound::collect(&self.scheduler, &mut self.requests, spec, &mut self.stats);
        let proposals = if round.asks.is_empty() {
            Vec::new()
        } else {
            propose_blocking(spec.proposer.as_mut(), &round.requests())?
        };
        let asked = round.asked();
        self.apply_proposals(asked, proposals)
    }

    /// `propose` for event-loop hosts: awaits a draft model's forwards (`step_async`).
    pub(super) async fn propose_async(&mut self) -> Result<()> {
        let Some(spec) = self.speculator.as_mut() else {
            return Ok(());
        };
        self.spec_probs.clear();
        let round =
            ProposalRound::collect(&self.scheduler, &mut self.requests, spec, &mut self.stats);
        let proposals = if round.asks.is_empty() {
            Vec::new()
        } else {
            propose_awaiting(spec.proposer.as_mut(), &round.requests()).await?
        };
        let asked = round.asked();
        self.apply_proposals(asked, proposals)
    }

    /// Hands each sequence its proposals (cut to what it asked for) and clears the others'.
    fn apply_proposals(&mut self, round: Asked, proposals: Vec<Proposal>) -> Result<()> {
        let vocab = self.executor.vocab_size();
        let name = self.speculator.as_ref().map_or("", |s| s.proposer.name());
        for (&(seq, max_tokens), mut p) in round.asks.iter().zip(proposals) {
            p.tokens.truncate(max_tokens);
            if !p.probs.is_empty() {
                if p.probs.len() < p.tokens.len() * vocab {
                    return Err(crate::error::BackendError::count(
                        "propose",
                        "draft probabilities",
                        p.probs.len(),
                        p.tokens.len() * vocab,
                    )
                    .on(name));
                }
                self.spec_probs.insert(seq, p.probs);
            }
            self.scheduler.set_proposals(seq, p.tokens);
        }
        for seq in round.quiet {
            self.scheduler.set_proposals(seq, Vec::new());
        }
        self.stats.spec.propose_micros += u64_saturating(round.started.elapsed().as_micros());
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

/// A sequence asking for proposals: its tokens stay in the scheduler's record.
struct Ask<'a> {
    seq: SeqId,
    tokens: &'a [u32],
    max_tokens: usize,
    temperature: f32,
    uniforms: Vec<f64>,
}

/// One step's proposal round: who asks, and whose old proposals are cleared.
struct ProposalRound<'a> {
    asks: Vec<Ask<'a>>,
    quiet: Vec<SeqId>,
    started: Instant,
}

/// A round once proposed: (sequence, most proposals it takes) per ask, in order.
struct Asked {
    asks: Vec<(SeqId, usize)>,
    quiet: Vec<SeqId>,
    started: Instant,
}

impl<'a> ProposalRound<'a> {
    /// Which running sequences ask for proposals this step, and how many each may take;
    /// sampled requests draw one uniform per proposal from their own generator.
    fn collect(
        scheduler: &'a Scheduler,
        requests: &mut HashMap<u64, Request>,
        spec: &mut Speculator,
        stats: &mut EngineStats,
    ) -> Self {
        let started = Instant::now();
        spec.proposer.retain(&|seq| scheduler.seq(seq).is_some());
        let enabled = scheduler.num_running() < spec.disable_by_batch_size;
        if !enabled {
            stats.spec.disabled_steps += 1;
        }
        let mut asks = Vec::new();
        let mut quiet = Vec::new();
        for (seq, s) in scheduler.running() {
            if s.num_computed + 1 != s.tokens.len() {
                continue;
            }
            let owner = requests.get_mut(&s.arrival);
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
            asks.push(Ask {
                seq,
                tokens: &s.tokens,
                max_tokens: k,
                temperature,
                uniforms,
            });
        }
        ProposalRound {
            asks,
            quiet,
            started,
        }
    }

    fn requests(&self) -> Vec<ProposalRequest<'_>> {
        self.asks
            .iter()
            .map(|a| ProposalRequest {
                seq: a.seq,
                tokens: a.tokens,
                max_tokens: a.max_tokens,
                temperature: a.temperature,
                uniforms: &a.uniforms,
            })
            .collect()
    }

    /// Lets go of the scheduler's records, keeping what the proposals are applied by.
    fn asked(self) -> Asked {
        Asked {
            asks: self.asks.iter().map(|a| (a.seq, a.max_tokens)).collect(),
            quiet: self.quiet,
            started: self.started,
        }
    }
}
