//! After the forward: prompt logprobs, one batch sampling call, then per request the new
//! tokens (forking parallel samples at the first one, or a beam-search step), stop checks,
//! text, and the outputs.

use std::collections::HashMap;
use web_time::Instant;

use super::job::{spec_job, Job, SpecCursor};
use super::sequences::{final_outputs, Ctx};
use super::step_outputs::StepOutputs;
use super::{Engine, Executor, RequestOutput, StepLogits, TokenLogprobs, TopLogprob};
use crate::block_manager::SeqId;
use crate::error::{BackendError, InferError, Result};
use crate::sampling::math::{log_sum_exp, top_n};
use crate::sampling::structured::allowed_tokens;
use crate::sampling::{sample_batch, Sample, SampledRow, SamplerRow};
use crate::scheduler::ScheduledChunk;
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;
use rayon::prelude::*;

impl<E: Executor> Engine<E> {
    /// Whether every row that samples this step is plain greedy (see
    /// `SamplingParams::is_plain_greedy`), so the argmax alone will do.
    pub(super) fn only_plain_greedy_rows(&self, chunks: &[ScheduledChunk]) -> bool {
        chunks.iter().filter(|c| c.want_logits).all(|c| {
            let Some(req) = self
                .scheduler
                .seq(c.seq)
                .and_then(|s| self.requests.get(&s.arrival))
            else {
                return false;
            };
            let p = &req.params;
            !c.all_logits
                && p.is_plain_greedy()
                && req.members.iter().all(|m| m.output.len() >= p.min_tokens)
        })
    }

    pub(super) fn process(
        &mut self,
        chunks: &[ScheduledChunk],
        step: &mut StepLogits,
        started: Instant,
    ) -> Result<Vec<RequestOutput>> {
        let vocab = self.executor.vocab_size();
        let num_rows = match &step.argmax {
            Some(ids) => ids.len(),
            None => step.rows.len() / vocab.max(1),
        };
        let mut jobs = self.collect_jobs(chunks, &step.rows, num_rows, vocab, started)?;
        self.stats.last_mask_time = std::time::Duration::ZERO;
        self.stats.last_sample_time = std::time::Duration::ZERO;
        let mut outputs = StepOutputs::default();
        let mut accepted: HashMap<SeqId, usize> = HashMap::new();
        // Speculating sequences verify one position per round: a row's penalties, mask and
        // stop checks see the tokens accepted before it.
        while !jobs.is_empty() {
            let tokens = self.sample_round(&jobs, step, vocab, &mut outputs)?;
            jobs = self.next_spec_jobs(jobs, &tokens, &mut accepted);
            if !jobs.is_empty() {
                outputs.start_merging();
            }
        }
        self.finish_speculation(chunks, &accepted)?;
        Ok(outputs.into_vec())
    }

    /// Samples the jobs' rows and applies them to their requests; returns the drawn tokens.
    fn sample_round(
        &mut self,
        jobs: &[Job],
        step: &mut StepLogits,
        vocab: usize,
        outputs: &mut StepOutputs,
    ) -> Result<Vec<u32>> {
        let masks = self.grammar_masks(jobs, vocab);
        let sampling = Instant::now();
        let sampled = match &step.argmax {
            Some(ids) => jobs
                .iter()
                .map(|job| {
                    let token = *ids
                        .get(job.row)
                        .ok_or_else(|| missing_row(job.row, ids.len()))?;
                    Ok(SampledRow {
                        samples: vec![Sample {
                            token,
                            logprob: None,
                        }],
                        top: Vec::new(),
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            None => self.sample_rows(jobs, &masks, &mut step.rows, vocab)?,
        };
        self.stats.last_sample_time += sampling.elapsed();
        let tokens = sampled
            .iter()
            .map(|r| r.samples.first().map_or(u32::MAX, |s| s.token))
            .collect();
        // Each request's rows, in the order its first row came.
        let mut order: Vec<u64> = Vec::new();
        let mut by_request: HashMap<u64, Vec<(usize, SampledRow)>> = HashMap::new();
        for (job, row) in jobs.iter().zip(sampled) {
            by_request
                .entry(job.key)
                .or_insert_with(|| {
                    order.push(job.key);
                    Vec::new()
                })
                .push((job.member, row));
        }
        for key in order {
            let rows = by_request.remove(&key).unwrap_or_default();
            if let Some(out) = self.advance(key, rows)? {
                outputs.push(out);
            }
        }
        Ok(tokens)
    }

    /// Each job's structured-output mask (`None` for unconstrained rows), computed for all
    /// constrained sequences in parallel: each matcher is taken out of its member, advanced
    /// on a worker thread, and put back.
    fn grammar_masks(&mut self, jobs: &[Job], vocab: usize) -> Vec<Option<SimpleVob>> {
        let started = Instant::now();
        let mut matchers: Vec<Option<Matcher>> = jobs
            .iter()
            .map(|j| {
                let m = self.requests.get_mut(&j.key)?.members.get_mut(j.member)?;
                m.grammar.take()
            })
            .collect();
        if matchers.iter().all(Option::is_none) {
            return vec![None; jobs.len()];
        }
        let masks: Vec<Option<SimpleVob>> = matchers
            .par_iter_mut()
            .map(|m| {
                let m = m.as_mut()?;
                // A failed matcher allows nothing: the row's draw ends the sequence, which
                // `accept` reports as finished by the grammar.
                Some(allowed_tokens(m).unwrap_or_else(|| SimpleVob::alloc(vocab)))
            })
            .collect();
        for (j, m) in jobs.iter().zip(matchers) {
            if let Some(member) = self
                .requests
                .get_mut(&j.key)
                .and_then(|r| r.members.get_mut(j.member))
            {
                member.grammar = m;
            }
        }
        self.stats.last_mask_time += started.elapsed();
        masks
    }

    /// The batch sampler over the jobs' logits rows.
    fn sample_rows(
        &self,
        jobs: &[Job],
        masks: &[Option<SimpleVob>],
        logits: &mut [f32],
        vocab: usize,
    ) -> Result<Vec<SampledRow>> {
        let mut rows: Vec<Option<&mut [f32]>> = logits.chunks_mut(vocab).map(Some).collect();
        // Each row's banned tokens: stop tokens before `min_tokens`, and `bad_words`.
        let bans: Vec<Vec<u32>> = jobs
            .iter()
            .map(|job| {
                let req = &self.requests[&job.key];
                let m = &req.members[job.member];
                let mut banned = Vec::new();
                if m.output.len() < req.params.min_tokens {
                    banned.extend_from_slice(&req.stop_ids);
                }
                banned.extend(super::admission::bad_word_bans(&req.bad_words, &m.output));
                banned
            })
            .collect();
        let mut batch = Vec::with_capacity(jobs.len());
        for (i, job) in jobs.iter().enumerate() {
            let req = &self.requests[&job.key];
            let m = &req.members[job.member];
            let seq = m.seq.and_then(|s| self.scheduler.seq(s));
            let tokens = seq.map_or(&[][..], |s| &s.tokens[..]);
            let p = &req.params;
            let beam_top = if p.use_beam_search {
                2 * p.best_of()
            } else {
                0
            };
            batch.push(SamplerRow {
                logits: rows[job.row]
                    .take()
                    .ok_or_else(|| missing_row(job.row, rows.len()))?,
                params: p,
                prompt: &tokens[..req.prompt.len().min(tokens.len())],
                output: &m.output,
                uniforms: &job.uniforms,
                banned: &bans[i],
                num_top: p.logprobs.unwrap_or(0).max(beam_top),
                allowed: masks.get(i).and_then(Option::as_ref),
                proposal: job.proposal(),
                proposal_probs: job.proposal_probs(vocab),
            });
        }
        Ok(sample_batch(&mut batch))
    }

    /// Metrics and prompt logprobs per chunk; the rows that sample, with their uniforms.
    fn collect_jobs(
        &mut self,
        chunks: &[ScheduledChunk],
        logits: &[f32],
        num_rows: usize,
        vocab: usize,
        started: Instant,
    ) -> Result<Vec<Job>> {
        let mut jobs = Vec::new();
        let mut row = 0;
        for c in chunks {
            let rows = if c.all_logits {
                c.num_new
            } else if c.num_spec > 0 {
                1 + c.num_spec
            } else {
                usize::from(c.want_logits)
            };
            let first_row = row;
            row += rows;
            if num_rows < row {
                return Err(missing_row(row - 1, num_rows));
            }
            let Some(key) = self.scheduler.seq(c.seq).map(|s| s.arrival) else {
                continue;
            };
            let Some(req) = self.requests.get_mut(&key) else {
                continue;
            };
            req.metrics.first_scheduled.get_or_insert(started);
            let prompt_len = req.prompt.len();
            if c.num_computed < prompt_len {
                self.stats.prompt_tokens_computed += c.num_new as u64;
            }
            if let (true, Some(k), Some(slots)) = (
                c.all_logits,
                req.params.prompt_logprobs,
                req.prompt_logprobs.as_mut(),
            ) {
                // Row r predicts the token after position num_computed + r.
                for r in 0..c.num_new {
                    let next = c.num_computed + r + 1;
                    if next < prompt_len {
                        let l = &logits[(first_row + r) * vocab..(first_row + r + 1) * vocab];
                        slots[next] = Some(token_logprobs(l, req.prompt[next], k));
                    }
                }
            }
            if !c.want_logits {
                continue;
            }
            let Some(member) = req.members.iter().position(|m| m.seq == Some(c.seq)) else {
                continue;
            };
            if c.num_spec > 0 {
                let proposals = self
                    .scheduler
                    .seq(c.seq)
                    .map(|s| s.spec.clone())
                    .unwrap_or_default();
                self.stats.spec.num_drafts += 1;
                self.stats.spec.num_draft_tokens += proposals.len() as u64;
                let spec = SpecCursor {
                    seq: c.seq,
                    position: 0,
                    proposals,
                    probs: self.spec_probs.remove(&c.seq).unwrap_or_default(),
                };
                jobs.push(spec_job(key, req, member, first_row, spec));
                continue;
            }
            let draws = if req.params.use_beam_search {
                0
            } else if req.before_first_token() {
                req.params.best_of()
            } else {
                1
            };
            let uniforms = (0..draws)
                .map(|k| {
                    let n = req.members.len();
                    rand::Rng::random(&mut req.members[(member + k) % n].rng)
                })
                .collect();
            jobs.push(Job {
                key,
                member,
                row: first_row + rows - 1,
                uniforms,
                spec: None,
            });
        }
        Ok(jobs)
    }

    /// Applies a request's sampled rows; returns its output for this step, if any.
    fn advance(
        &mut self,
        key: u64,
        rows: Vec<(usize, SampledRow)>,
    ) -> Result<Option<RequestOutput>> {
        let Some(req) = self.requests.get_mut(&key) else {
            return Ok(None);
        };
        let now = Instant::now();
        req.metrics.first_token.get_or_insert(now);
        let mut ctx = Ctx {
            scheduler: &mut self.scheduler,
            tokenizer: self.tokenizer.as_deref(),
            stats: &mut self.stats,
            next_seq: &mut self.next_seq,
        };
        let deltas = if req.params.use_beam_search {
            ctx.beam_step(req, rows)?;
            Vec::new()
        } else {
            ctx.sample_step(req, rows)?
        };
        let streamable = req.params.streamable();
        if !req.members.is_empty() {
            let out = (streamable && !deltas.is_empty()).then(|| RequestOutput {
                request_id: req.id.clone(),
                deltas,
                outputs: None,
                prompt_logprobs: None,
                metrics: req.metrics,
            });
            return Ok(out);
        }
        // Every sequence ended: the request is done.
        let Some(mut req) = self.requests.remove(&key) else {
            return Ok(None);
        };
        self.ids.remove(&req.id);
        req.metrics.finished = Some(now);
        let outputs = final_outputs(&mut req, self.tokenizer.as_deref())?;
        Ok(Some(RequestOutput {
            request_id: req.id,
            deltas: if streamable { deltas } else { Vec::new() },
            outputs: Some(outputs),
            prompt_logprobs: req.prompt_logprobs,
            metrics: req.metrics,
        }))
    }
}

/// `token`'s log-probability under a raw logits row, with the row's top `k`.
fn token_logprobs(row: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let lse = log_sum_exp(row);
    let logit = row.get(token as usize).copied();
    TokenLogprobs {
        token_id: token,
        logprob: logit.map_or(f32::NAN, |l| l - lse),
        rank: logit.map(|l| 1 + row.iter().filter(|&&x| x > l).count()),
        top_logprobs: top_n(row, k)
            .into_iter()
            .map(|(token_id, l)| TopLogprob {
                token_id,
                logprob: l - lse,
            })
            .collect(),
    }
}

/// The executor's logits lack a row the step scheduled.
fn missing_row(row: usize, rows: usize) -> InferError {
    BackendError::out_of_range("read_logits", "logit row", row as u64, rows).on("executor")
}
