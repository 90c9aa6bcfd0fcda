//! Single-sequence generation over the paged KV cache: chunked prefill, then one token per
//! step, streaming text as it completes. The minimal loop without a scheduler: reference
//! tests use it; everything serving many requests goes through `engine::Engine`.

use std::time::Duration;

use web_time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use serde::Serialize;

use crate::backend::Backend;
use crate::batch::{BatchInput, SequenceChunk};
use crate::block_manager::{BlockManager, PrefixHit};
use crate::error::{InferError, Result};
use crate::model::Model;
use crate::sampling::{sample_batch, SamplerRow, SamplingParams};
use crate::tokenizer::{IncrementalDetokenizer, Tokenizer};

pub const DEFAULT_BLOCK_SIZE: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token was sampled.
    Stop,
    /// `max_tokens` or the context limit was reached.
    Length,
}

impl FinishReason {
    /// The API's name for it (`stop`, `length`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct GenerationOutput {
    pub prompt_token_ids: Vec<u32>,
    /// Generated ids, the stop token included.
    pub token_ids: Vec<u32>,
    /// Generated text, special tokens skipped.
    pub text: String,
    pub finish_reason: FinishReason,
    /// Prompt processing up to the first sampled token.
    pub prefill_time: Duration,
    /// Everything after the first token.
    pub decode_time: Duration,
}

impl GenerationOutput {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt_token_ids.len() as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Tokens after the first, which comes out of the prefill step.
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.token_ids.len().saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

pub struct Generator<'a, B: Backend> {
    pub backend: &'a B,
    pub model: &'a Model<B>,
    pub tokenizer: &'a Tokenizer,
    pub block_size: usize,
    /// Prompt tokens per prefill step (bounds activation memory for long prompts).
    pub prefill_chunk: usize,
}

impl<'a, B: Backend> Generator<'a, B> {
    pub fn new(backend: &'a B, model: &'a Model<B>, tokenizer: &'a Tokenizer) -> Self {
        Generator {
            backend,
            model,
            tokenizer,
            block_size: DEFAULT_BLOCK_SIZE,
            prefill_chunk: 512,
        }
    }

    /// Generates from `prompt`, calling `on_text` with each newly completed piece of text.
    pub fn generate(
        &self,
        prompt: &[u32],
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<GenerationOutput> {
        let max_len = self.model.max_model_len();
        if prompt.is_empty() {
            return Err(InferError::EmptyPrompt);
        }
        if prompt.len() >= max_len {
            return Err(InferError::PromptTooLong {
                prompt_tokens: prompt.len(),
                max_model_len: max_len,
            });
        }
        params.validate()?;
        if params.best_of() > 1 {
            return Err(InferError::invalid(
                "n",
                "the single-sequence generator samples one sequence",
            ));
        }
        let mut rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        let mut stop_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_ids.extend(self.tokenizer.eos_token_ids());
        }
        let max_tokens = params.max_tokens.unwrap_or(max_len);
        // The cache holds at most the prompt plus every token but the last sampled one.
        let capacity = (prompt.len() + max_tokens).min(max_len);
        let num_blocks = capacity.div_ceil(self.block_size);
        let mut kv = self
            .backend
            .alloc_kv_cache(&self.model.kv_cache_spec(num_blocks, self.block_size))?;
        let mut blocks = BlockManager::new(self.block_size, num_blocks, 0, false);

        let start = Instant::now();
        let mut tokens = prompt.to_vec();
        let mut computed = 0;
        let mut detok = IncrementalDetokenizer::new(prompt, true);
        let mut first_token_at = None;
        let finish_reason = loop {
            // Prefill in chunks, then one token at a time.
            let end = (computed + self.prefill_chunk).min(tokens.len());
            let is_last_chunk = end == tokens.len();
            if computed == 0 {
                blocks.allocate(0, PrefixHit::default(), &tokens, end)?;
            } else if blocks
                .append_slots(0, &tokens, computed, end - computed)?
                .is_none()
            {
                return Err(InferError::KvCache("out of blocks".into()));
            }
            let batch = BatchInput::build(
                &[SequenceChunk {
                    tokens: &tokens[computed..end],
                    num_computed: computed,
                    block_table: blocks.block_table(0).unwrap_or(&[]),
                    want_logits: is_last_chunk,
                    all_logits: false,
                }],
                self.block_size,
            )?;
            let logits = self.model.forward(self.backend, &batch, &mut kv)?;
            computed = end;
            if !is_last_chunk {
                continue;
            }
            let mut logits = self.backend.to_host(&logits)?.data;
            let generated = tokens.len() - prompt.len();
            let next = sample_batch(&mut [SamplerRow {
                logits: &mut logits,
                params,
                prompt,
                output: &tokens[prompt.len()..],
                uniforms: &[rng.random()],
                banned: if generated < params.min_tokens {
                    &stop_ids
                } else {
                    &[]
                },
                num_top: 0,
                allowed: None,
                proposal: None,
                proposal_probs: None,
            }])[0]
                .samples[0]
                .token;
            first_token_at.get_or_insert_with(Instant::now);
            tokens.push(next);
            let generated = tokens.len() - prompt.len();
            if generated >= params.min_tokens && stop_ids.contains(&next) {
                break FinishReason::Stop;
            }
            on_text(&detok.push(self.tokenizer, next)?);
            if generated >= max_tokens || tokens.len() >= max_len {
                break FinishReason::Length;
            }
        };
        let first = first_token_at.unwrap_or(start);
        let token_ids = tokens[prompt.len()..].to_vec();
        Ok(GenerationOutput {
            text: self.tokenizer.decode(&token_ids, true)?,
            prompt_token_ids: prompt.to_vec(),
            token_ids,
            finish_reason,
            prefill_time: first - start,
            decode_time: first.elapsed(),
        })
    }
}
