//! What a step does to a request's sequences: new tokens and stop checks for parallel
//! samples (forked from the prompt at the first token), one beam-search step for beams, and
//! the returned outputs once every sequence has ended.

use super::finish::FinishReason;
use super::request::{Member, Request};
use super::{CompletionOutput, EngineStats, SequenceDelta, StopReason, TokenLogprobs, TopLogprob};
use crate::block_manager::SeqId;
use crate::error::{InferError, Result};
use crate::sampling::{beam, holdback, Sample, SampledRow};
use crate::scheduler::Scheduler;
use crate::tokenizer::Tokenizer;

/// The engine state a request's step touches besides the request itself.
pub(super) struct Ctx<'a> {
    pub scheduler: &'a mut Scheduler,
    pub tokenizer: Option<&'a Tokenizer>,
    pub stats: &'a mut EngineStats,
    pub next_seq: &'a mut SeqId,
}

impl Ctx<'_> {
    /// A copy of `parent` (same arrival, so the same request).
    fn fork(&mut self, parent: SeqId) -> Result<SeqId> {
        let child = *self.next_seq;
        *self.next_seq += 1;
        self.scheduler.fork(parent, child)?;
        Ok(child)
    }

    fn end(&mut self, seq: Option<SeqId>) {
        if let Some(seq) = seq {
            self.scheduler.remove(seq);
        }
    }

    /// Parallel sampling: the first row of a best_of > 1 request drew one token per sample,
    /// and the samples fork from the prompt's sequence here.
    pub fn sample_step(
        &mut self,
        req: &mut Request,
        rows: Vec<(usize, SampledRow)>,
    ) -> Result<Vec<SequenceDelta>> {
        let mut deltas = Vec::new();
        for (member, row) in rows {
            if row.samples.len() > 1 {
                let parent = req.members[0].seq.ok_or_else(|| bug("unforked samples"))?;
                for m in req.members.iter_mut().skip(1) {
                    m.seq = Some(self.fork(parent)?);
                }
                for (i, s) in row.samples.iter().enumerate() {
                    deltas.push(self.accept(req, i, *s, &row.top)?);
                }
            } else if let Some(&s) = row.samples.first() {
                deltas.push(self.accept(req, member, s, &row.top)?);
            }
        }
        // Finished samples free their blocks now; the request waits for the rest.
        let (done, live): (Vec<Member>, Vec<Member>) =
            req.members.drain(..).partition(|m| m.finish.is_some());
        req.members = live;
        for mut m in done {
            self.end(m.seq.take());
            req.done.push(m);
        }
        Ok(deltas)
    }

    /// Appends a sampled token to a member and checks its stop conditions.
    fn accept(
        &mut self,
        req: &mut Request,
        member: usize,
        sample: Sample,
        top: &[(u32, f32)],
    ) -> Result<SequenceDelta> {
        let p = &req.params;
        let m = &mut req.members[member];
        let token = sample.token;
        if let Some(seq) = m.seq {
            self.scheduler.append_token(seq, token);
        }
        m.output.push(token);
        self.stats.output_tokens += 1;
        req.metrics.num_output_tokens += 1;
        if let Some(lp) = sample.logprob {
            m.cumulative_logprob += lp as f64;
        }
        let entry = p.logprobs.map(|k| TokenLogprobs {
            token_id: token,
            logprob: sample.logprob.unwrap_or(f32::NAN),
            top_logprobs: top_entries(top, k),
            rank: None,
        });
        m.logprobs.extend(entry.clone());
        let may_stop = m.output.len() >= p.min_tokens;
        let mut finish = None;
        if may_stop && req.stop_ids.contains(&token) {
            let reason = p
                .stop_token_ids
                .contains(&token)
                .then_some(StopReason::Token(token));
            finish = Some((FinishReason::Stop, reason));
        }
        if finish.is_none() || p.include_stop_str_in_output {
            if let (Some(d), Some(t)) = (&mut m.detokenizer, self.tokenizer) {
                let piece = d.push(t, token)?;
                let stops = if may_stop && finish.is_none() {
                    &p.stop[..]
                } else {
                    &[]
                };
                if let Some(i) = m.text.push(&piece, stops, p.include_stop_str_in_output) {
                    finish = Some((
                        FinishReason::Stop,
                        Some(StopReason::String(p.stop[i].clone())),
                    ));
                }
            }
        }
        if finish.is_none() {
            if let Some(g) = &mut m.grammar {
                // The grammar is complete (or the token broke it): the output ends here.
                if g.consume_token(token).is_err() || g.is_stopped() {
                    finish = Some((FinishReason::Stop, None));
                }
            }
        }
        if finish.is_none() && req.prompt.len() + m.output.len() >= req.max_len {
            finish = Some((FinishReason::Length, None));
        }
        let text_delta = m.text.take_delta(holdback(&p.stop), finish.is_some());
        m.finish = finish.clone();
        Ok(SequenceDelta {
            index: m.index,
            new_token_ids: vec![token],
            text_delta,
            logprobs: entry.into_iter().collect(),
            finish_reason: finish.as_ref().map(|f| f.0),
            stop_reason: finish.and_then(|f| f.1),
        })
    }

    /// One beam-search step over every live beam's top extensions.
    pub fn beam_step(&mut self, req: &mut Request, rows: Vec<(usize, SampledRow)>) -> Result<()> {
        let width = req.params.best_of();
        if rows.len() != req.members.len() {
            return Err(bug("a beam group sampled partly"));
        }
        let mut tops = vec![Vec::new(); req.members.len()];
        for (member, row) in rows {
            tops[member] = row.top;
        }
        let cumulative: Vec<f64> = req.members.iter().map(|m| m.cumulative_logprob).collect();
        let may_stop = req.members[0].output.len() + 1 >= req.params.min_tokens;
        let choice = beam::choose(&cumulative, &tops, width, |t| {
            may_stop && req.stop_ids.contains(&t)
        });
        let k = req.params.logprobs;
        let extend = |m: &Member, c: &beam::Candidate, tops: &[Vec<(u32, f32)>]| {
            let mut m = m.clone();
            m.seq = None;
            m.output.push(c.token);
            m.cumulative_logprob = c.cumulative_logprob;
            if let Some(k) = k {
                let top = &tops[c.parent];
                m.logprobs.push(TokenLogprobs {
                    token_id: c.token,
                    logprob: top
                        .iter()
                        .find(|t| t.0 == c.token)
                        .map_or(f32::NAN, |t| t.1),
                    top_logprobs: top_entries(top, k),
                    rank: None,
                });
            }
            m
        };
        for c in &choice.finished {
            let mut h = extend(&req.members[c.parent], c, &tops);
            let reason = req
                .params
                .stop_token_ids
                .contains(&c.token)
                .then_some(StopReason::Token(c.token));
            h.finish = Some((FinishReason::Stop, reason));
            req.done.push(h);
        }
        // Forks first (a fork copies its parent's tokens), then the new tokens.
        let mut used = vec![false; req.members.len()];
        let mut next = Vec::with_capacity(choice.next.len());
        for c in &choice.next {
            let parent = req.members[c.parent]
                .seq
                .ok_or_else(|| bug("a live beam without a sequence"))?;
            let seq = if std::mem::replace(&mut used[c.parent], true) {
                self.fork(parent)?
            } else {
                parent
            };
            let mut m = extend(&req.members[c.parent], c, &tops);
            m.seq = Some(seq);
            next.push(m);
        }
        for (i, m) in req.members.iter().enumerate() {
            if !used[i] {
                self.end(m.seq);
            }
        }
        for (i, m) in next.iter_mut().enumerate() {
            m.index = i;
            if let Some(seq) = m.seq {
                self.scheduler
                    .append_token(seq, *m.output.last().unwrap_or(&0));
            }
            self.stats.output_tokens += 1;
            req.metrics.num_output_tokens += 1;
        }
        let (done, live): (Vec<Member>, Vec<Member>) = next
            .into_iter()
            .partition(|m| req.prompt.len() + m.output.len() >= req.max_len);
        for mut m in done {
            self.end(m.seq.take());
            m.finish = Some((FinishReason::Length, None));
            req.done.push(m);
        }
        req.members = live;
        let lp = req.params.length_penalty;
        let scores: Vec<f64> = req
            .done
            .iter()
            .map(|m| beam::beam_score(m.cumulative_logprob, m.output.len(), lp))
            .collect();
        let best_live = req
            .members
            .iter()
            .map(|m| (m.cumulative_logprob, m.output.len()))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if beam::search_done(&scores, best_live, width, lp, req.params.early_stopping) {
            for m in req.members.drain(..) {
                self.end(m.seq);
            }
        }
        Ok(())
    }
}

/// The returned sequences of a finished request.
pub(super) fn final_outputs(
    req: &mut Request,
    tokenizer: Option<&Tokenizer>,
) -> Result<Vec<CompletionOutput>> {
    let p = &req.params;
    let mut done = std::mem::take(&mut req.done);
    if p.use_beam_search {
        let score =
            |m: &Member| beam::beam_score(m.cumulative_logprob, m.output.len(), p.length_penalty);
        done.sort_by(|a, b| score(b).total_cmp(&score(a)));
    } else if p.best_of() > p.n {
        done.sort_by(|a, b| {
            b.cumulative_logprob
                .total_cmp(&a.cumulative_logprob)
                .then(a.index.cmp(&b.index))
        });
    } else {
        done.sort_by_key(|m| m.index);
    }
    done.truncate(p.n);
    let ranked = !p.streamable();
    done.into_iter()
        .enumerate()
        .map(|(rank, m)| {
            let (finish_reason, stop_reason) = m.finish.unwrap_or((FinishReason::Length, None));
            let text = match (tokenizer, p.use_beam_search) {
                // Beams are decoded once at the end; a stop token's text is left out.
                (Some(t), true) => {
                    let n = m.output.len() - usize::from(finish_reason == FinishReason::Stop);
                    t.decode(&m.output[..n], p.skip_special_tokens)?
                }
                _ => m.text.text().to_string(),
            };
            Ok(CompletionOutput {
                index: if ranked { rank } else { m.index },
                text,
                token_ids: m.output,
                finish_reason,
                stop_reason,
                cumulative_logprob: p.needs_logprobs().then_some(m.cumulative_logprob),
                logprobs: p.logprobs.map(|_| m.logprobs),
            })
        })
        .collect()
}

fn top_entries(top: &[(u32, f32)], k: usize) -> Vec<TopLogprob> {
    top.iter()
        .take(k)
        .map(|&(token_id, logprob)| TopLogprob { token_id, logprob })
        .collect()
}

fn bug(what: &str) -> InferError {
    InferError::KvCache(format!("engine invariant broken: {what}"))
}
