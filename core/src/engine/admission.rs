//! Admitting a request: validation against the engine's limits, its sequence in the
//! scheduler, and its members (parallel samples, or the first beam).

use std::sync::Arc;

use web_time::Instant;

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::request::{Member, Request};
use super::{Engine, Executor, Prompt, RequestMetrics};
use crate::error::{InferError, Result};
use crate::sampling::{GrammarCompiler, OutputText, SamplingParams};
use crate::scheduler::SeqState;
use crate::tokenizer::IncrementalDetokenizer;
use llguidance::Matcher;

impl<E: Executor> Engine<E> {
    /// Queues a request. Fails, with nothing queued, on a known id, an empty prompt, a prompt
    /// that leaves no room in the context, bad parameters, or a request the KV pool could
    /// never hold.
    pub fn add_request(
        &mut self,
        id: impl Into<String>,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
    ) -> Result<()> {
        self.add_request_compiled(id, prompt, params, None)
    }

    /// `add_request` with the request's structured-output matcher already compiled
    /// (`grammar_compiler().compile(..)`, e.g. on another thread, so a big grammar does not
    /// stall the steps of running requests); `None` compiles it here when one is asked for.
    pub fn add_request_compiled(
        &mut self,
        id: impl Into<String>,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        compiled: Option<Matcher>,
    ) -> Result<()> {
        let id = id.into();
        if self.ids.contains_key(&id) {
            return Err(InferError::invalid(
                "request_id",
                format!("`{id}` is already in use"),
            ));
        }
        params.validate()?;
        self.check_request_limits(&params)?;
        let grammar = match (&params.structured_outputs, compiled) {
            (Some(_), Some(matcher)) => Some(matcher),
            (Some(spec), None) => Some(self.grammar_compiler()?.compile(spec)?),
            (None, _) => None,
        };
        let tokens = match prompt.into() {
            Prompt::Tokens(t) => t,
            Prompt::Text(text) => match &self.tokenizer {
                Some(tok) => tok.encode(&text, true)?,
                None => return Err(InferError::invalid("prompt", "text needs a tokenizer")),
            },
        };
        if tokens.is_empty() {
            return Err(InferError::EmptyPrompt);
        }
        let vocab = self.executor.vocab_size();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(InferError::invalid(
                "prompt",
                format!("token id {t} is outside the vocabulary ({vocab})"),
            ));
        }
        let max_model_len = self.config.max_model_len;
        if tokens.len() >= max_model_len {
            return Err(InferError::PromptTooLong {
                prompt_tokens: tokens.len(),
                max_model_len,
            });
        }
        let max_len = match params.max_tokens {
            Some(m) => (tokens.len() + m).min(max_model_len),
            None => max_model_len,
        };
        // Every sequence of the group at full length, sharing the prompt's full blocks.
        let bs = self.config.block_size;
        let full = max_len.div_ceil(bs);
        let needed = full + (params.best_of() - 1) * (full - tokens.len() / bs);
        if needed > self.config.num_device_blocks {
            return Err(InferError::KvCache(format!(
                "the request may grow to {} sequences of {max_len} tokens ({needed} blocks) but the KV pool holds {} blocks; lower max_tokens or best_of, or enlarge the pool",
                params.best_of(),
                self.config.num_device_blocks
            )));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut state = SeqState::new(seq, tokens.clone());
        state.group_size = params.best_of();
        state.priority = params.priority;
        state.cache_root = params
            .cache_salt
            .as_deref()
            .map(crate::block_manager::cache_salt_root);
        if params.prompt_logprobs.is_some() {
            state.all_logits_until = tokens.len();
        }
        self.scheduler.add(seq, state)?;
        let mut stop_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_ids.extend(&self.eos_token_ids);
        }
        // A request without a seed takes the next of the engine's (`--seed`), if it has one.
        let seed = params
            .seed
            .or_else(|| self.seeds.as_mut().map(rand::RngCore::next_u64));
        let bad_words = match &self.tokenizer {
            Some(tok) => bad_word_ids(tok, &params.bad_words)?,
            None => Vec::new(),
        };
        // Samples exist from the start (forked at the first token); beams appear as chosen.
        let num_members = if params.use_beam_search {
            1
        } else {
            params.best_of()
        };
        let members = (0..num_members)
            .map(|index| Member {
                index,
                seq: (index == 0).then_some(seq),
                // Each sample its own stream: seeded ones reproduce whatever the batch.
                rng: match seed {
                    Some(s) => StdRng::seed_from_u64(
                        s.wrapping_add((index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                    ),
                    None => StdRng::from_os_rng(),
                },
                output: Vec::new(),
                detokenizer: self
                    .tokenizer
                    .as_ref()
                    .map(|_| IncrementalDetokenizer::new(&tokens, params.skip_special_tokens)),
                text: OutputText::default(),
                cumulative_logprob: 0.0,
                logprobs: Vec::new(),
                finish: None,
                grammar: grammar.clone(),
            })
            .collect();
        let num_prompt_tokens = tokens.len();
        self.requests.insert(
            seq,
            Request {
                id: id.clone(),
                prompt_logprobs: params.prompt_logprobs.map(|_| vec![None; tokens.len()]),
                params,
                prompt: tokens,
                max_len,
                members,
                done: Vec::new(),
                stop_ids,
                bad_words,
                metrics: RequestMetrics {
                    arrival: Instant::now(),
                    first_scheduled: None,
                    first_token: None,
                    finished: None,
                    num_prompt_tokens,
                    num_output_tokens: 0,
                    num_preemptions: 0,
                    num_cached_tokens: None,
                },
            },
        );
        self.ids.insert(id, seq);
        Ok(())
    }

    /// Builds the structured-output token trie now (a server does it at start, so the first
    /// constrained request does not stall the running ones while it is built).
    pub fn prepare_structured_outputs(&mut self) -> Result<()> {
        if self.tokenizer.is_some() {
            self.grammar_compiler()?;
        }
        Ok(())
    }

    /// The structured-output compiler over the engine's tokenizer, built on first use. It is
    /// shared (`Send + Sync`): constraints may be compiled on any thread.
    pub fn grammar_compiler(&mut self) -> Result<Arc<GrammarCompiler>> {
        if let Some(g) = &self.grammars {
            return Ok(g.clone());
        }
        let tokenizer = self.tokenizer.as_ref().ok_or_else(|| {
            InferError::invalid(
                crate::sampling::structured::PARAM,
                "structured outputs need a tokenizer",
            )
        })?;
        let started = Instant::now();
        let g = Arc::new(GrammarCompiler::new(
            tokenizer,
            self.executor.vocab_size(),
            self.strict_json_schema,
        )?);
        tracing::info!(elapsed = ?started.elapsed(), "structured-output token trie built");
        self.grammars = Some(g.clone());
        Ok(g)
    }

    /// Limits that depend on the engine: the vocabulary and the sequence cap.
    fn check_request_limits(&self, params: &SamplingParams) -> Result<()> {
        let vocab = self.executor.vocab_size();
        let outside = |t: &&u32| **t as usize >= vocab;
        for (name, t) in [
            ("logit_bias", params.logit_bias.keys().find(outside)),
            ("stop_token_ids", params.stop_token_ids.iter().find(outside)),
            (
                "allowed_token_ids",
                params.allowed_token_ids.iter().flatten().find(outside),
            ),
        ] {
            if let Some(t) = t {
                return Err(InferError::invalid(
                    name,
                    format!("token id {t} is outside the vocabulary ({vocab})"),
                ));
            }
        }
        if params.best_of() > self.config.scheduler.max_num_seqs {
            // Name the field the client set: `best_of` when given, else `n`.
            let name = if params.best_of.is_some() {
                "best_of"
            } else {
                "n"
            };
            return Err(InferError::invalid(
                name,
                format!(
                    "{} sequences exceed max_num_seqs ({})",
                    params.best_of(),
                    self.config.scheduler.max_num_seqs
                ),
            ));
        }
        let max = self.max_logprobs;
        for (name, v) in [
            ("logprobs", params.logprobs),
            ("prompt_logprobs", params.prompt_logprobs),
        ] {
            if v.is_some_and(|k| k > max) {
                return Err(InferError::invalid(
                    name,
                    format!("at most {max} (the server's --max-logprobs)"),
                ));
            }
        }
        if params.priority != 0 && !self.priority_scheduling {
            return Err(InferError::invalid(
                "priority",
                "priorities need the server's --scheduling-policy priority (first come, first served now)",
            ));
        }
        if !params.bad_words.is_empty() && self.tokenizer.is_none() {
            return Err(InferError::invalid(
                "bad_words",
                "bad words need a tokenizer",
            ));
        }
        if params.use_beam_search && !params.stop.is_empty() {
            return Err(InferError::invalid(
                "stop",
                "stop strings are not supported with beam search (stop token ids are)",
            ));
        }
        if !params.stop.is_empty() && self.tokenizer.is_none() {
            return Err(InferError::invalid("stop", "stop strings need a tokenizer"));
        }
        Ok(())
    }
}

/// vLLM's tokenization of `bad_words`: each word as written (leading spaces trimmed) and with
/// one leading space, without special tokens; the spaced form counts only where it is a
/// different word of as many tokens (not a lone space token before the same ones).
fn bad_word_ids(tok: &crate::Tokenizer, words: &[String]) -> Result<Vec<Vec<u32>>> {
    let mut out: Vec<Vec<u32>> = Vec::with_capacity(words.len() * 2);
    for word in words {
        let word = word.trim_start();
        let plain = tok.encode(word, false)?;
        let spaced = tok.encode(&format!(" {word}"), false)?;
        let distinct = spaced.len() == plain.len() && spaced.first() != plain.first();
        out.push(plain);
        if distinct {
            out.push(spaced);
        }
    }
    out.retain(|ids| !ids.is_empty());
    Ok(out)
}

/// The tokens `bad_words` ban after `output`: each word's last token where the output ends
/// with the tokens before it.
pub(crate) fn bad_word_bans<'a>(
    words: &'a [Vec<u32>],
    output: &'a [u32],
) -> impl Iterator<Item = u32> + 'a {
    words.iter().filter_map(move |ids| {
        let (last, before) = ids.split_last()?;
        output.ends_with(before).then_some(*last)
    })
}
