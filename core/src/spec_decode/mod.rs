//! Speculative decoding: a proposer guesses a decoding sequence's next k tokens, the target
//! model scores all of them in one forward (the step schedules `1 + k` query tokens), and the
//! engine keeps the longest run the target agrees with plus one token of its own. Decode is
//! bound by reading the weights once per step, so the speed-up is about the accepted length.
//!
//! Sampled rows verify by rejection sampling: a proposed token x is accepted with probability
//! min(1, p(x)/q(x)), and on rejection the token is drawn from the residual max(0, p − q),
//! normalized, which leaves the output distribution exactly the target's p (see
//! `sampling::sampler`). The draft model samples its proposals for sampled requests and reports
//! q; deterministic proposals (the n-gram lookup, a greedy draft) have a one-hot q, for which
//! the rule reads: accept with probability p(x), else draw from p without x.

mod draft;
mod ngram;

use serde::{Deserialize, Serialize};

pub use draft::DraftProposer;
pub use ngram::NgramProposer;

use crate::backend::{PendingLogits, StepLogits};
use crate::block_manager::SeqId;
use crate::error::{InferError, Result};

/// Most proposals per sequence and step (the per-position acceptance counters hold this
/// many).
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// Default for `disable_by_batch_size`: speculation pays while the step is bound by reading
/// the weights; from this many running sequences on, verifying k extra tokens per sequence
/// costs more than it saves (measured on the CPU backend with SmolLM2, see the README).
pub const DEFAULT_DISABLE_BY_BATCH_SIZE: usize = 4;

/// `--speculative-config` as vLLM spells it: `{"method": "ngram", "num_speculative_tokens": 4,
/// "prompt_lookup_max": 4}` or `{"model": "...", "num_speculative_tokens": 4}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeConfig {
    /// `ngram` (prompt lookup) or `draft_model` (implied by `model`).
    #[serde(default)]
    pub method: Option<String>,
    /// The draft model (same tokenizer as the target).
    #[serde(default)]
    pub model: Option<String>,
    pub num_speculative_tokens: usize,
    /// Longest and shortest n-gram matched (ngram only).
    #[serde(default)]
    pub prompt_lookup_max: Option<usize>,
    #[serde(default)]
    pub prompt_lookup_min: Option<usize>,
    /// Speculation is skipped in a step with at least this many running sequences.
    #[serde(default)]
    pub disable_by_batch_size: Option<usize>,
}

/// Which proposer a checked configuration asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecMethod {
    Ngram { min: usize, max: usize },
    Draft { model: String },
}

impl SpeculativeConfig {
    /// Parses the JSON of `--speculative-config`; unknown keys are errors that name them.
    pub fn from_json(json: &str) -> Result<Self> {
        let config: SpeculativeConfig = serde_json::from_str(json)
            .map_err(|e| InferError::invalid("speculative_config", e.to_string()))?;
        config.method()?;
        Ok(config)
    }

    /// The proposer, with its parameters checked.
    pub fn method(&self) -> Result<SpecMethod> {
        let k = self.num_speculative_tokens;
        if k == 0 || k > MAX_SPECULATIVE_TOKENS {
            return Err(InferError::invalid(
                "num_speculative_tokens",
                format!("{k} (expected 1..={MAX_SPECULATIVE_TOKENS})"),
            ));
        }
        if self.disable_by_batch_size == Some(0) {
            return Err(InferError::invalid("disable_by_batch_size", "must be > 0"));
        }
        let lookup_keys = self.prompt_lookup_max.is_some() || self.prompt_lookup_min.is_some();
        match (self.method.as_deref(), &self.model) {
            (Some("ngram"), None) => {
                // vLLM's defaults: 5 and 5, and one bound given stands for both.
                let (min, max) = match (self.prompt_lookup_min, self.prompt_lookup_max) {
                    (None, None) => (5, 5),
                    (Some(min), None) => (min, min),
                    (None, Some(max)) => (max, max),
                    (Some(min), Some(max)) => (min, max),
                };
                if min == 0 || min > max {
                    return Err(InferError::invalid(
                        "prompt_lookup_min",
                        format!("{min} must be in 1..=prompt_lookup_max ({max})"),
                    ));
                }
                Ok(SpecMethod::Ngram { min, max })
            }
            (None | Some("draft_model"), Some(model)) if !lookup_keys => Ok(SpecMethod::Draft {
                model: model.clone(),
            }),
            (None | Some("draft_model"), Some(_)) => Err(InferError::invalid(
                "prompt_lookup_max",
                "only applies to method ngram",
            )),
            (Some("ngram"), Some(_)) => Err(InferError::invalid(
                "model",
                "method ngram takes no draft model",
            )),
            (None, None) | (Some("draft_model"), None) => Err(InferError::invalid(
                "speculative_config",
                "give `\"method\": \"ngram\"` or a draft `\"model\"`",
            )),
            (Some(other), _) => Err(InferError::invalid(
                "method",
                format!("`{other}` is not supported (ngram, draft_model)"),
            )),
        }
    }

    pub fn disable_by_batch_size(&self) -> usize {
        self.disable_by_batch_size
            .unwrap_or(DEFAULT_DISABLE_BY_BATCH_SIZE)
    }
}

/// A sequence asking for proposals: its tokens (prompt and output) and how many it may take.
#[derive(Debug, Clone, Copy)]
pub struct ProposalRequest<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub max_tokens: usize,
    /// The request's temperature (0: greedy): a sampling proposer draws at it.
    pub temperature: f32,
    /// One uniform per proposal from the request's generator (empty for greedy requests), so
    /// seeded requests stay reproducible.
    pub uniforms: &'a [f64],
}

/// Proposed tokens and, when they were sampled, the distribution each was drawn from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// `[tokens.len() * vocab]` the proposal distribution q per position; empty when the
    /// proposals are deterministic (q one-hot).
    pub probs: Vec<f32>,
}

impl Proposal {
    pub fn deterministic(tokens: Vec<u32>) -> Self {
        Proposal {
            tokens,
            probs: Vec::new(),
        }
    }
}

/// Guesses the next tokens of decoding sequences. A round of proposals may need device
/// forwards (a draft model): `begin` then returns `Round::Forward` with the forward's pending
/// logits, and the caller hands their read-back to `resume` until `Round::Done`. Waiting is the
/// caller's: `propose_blocking` blocks (native), `propose_awaiting` awaits (the browser's
/// event loop), so one proposer serves `Engine::step` and `Engine::step_async` alike.
pub trait Proposer {
    /// Starts a round for `requests` (up to `max_tokens` proposals each, possibly none).
    /// Proposers that compute on the host answer `Round::Done` at once.
    fn begin(&mut self, requests: &[ProposalRequest]) -> Result<Round>;
    /// Continues the round with the read-back of the forward `begin` or the last `resume`
    /// returned.
    fn resume(&mut self, _logits: Result<StepLogits>) -> Result<Round> {
        Err(InferError::invalid(
            "speculative_config",
            format!("the {} proposer runs no forwards", self.name()),
        ))
    }
    /// Drives the device while a forward is in flight (a blocking wait's loop body).
    fn wait_device(&self) -> Result<()> {
        Ok(())
    }
    /// Forgets the sequences for which `live` is false (ended or aborted).
    fn retain(&mut self, _live: &dyn Fn(SeqId) -> bool) {}
    /// For logs and metrics.
    fn name(&self) -> &'static str;
}

/// Where a round of proposals stands.
pub enum Round {
    /// One proposal per request, in order.
    Done(Vec<Proposal>),
    /// A forward is on the device: pass its read-back to `Proposer::resume`.
    Forward(PendingLogits),
}

/// Runs a round to the end, blocking on each forward's read-back.
pub fn propose_blocking(
    p: &mut dyn Proposer,
    requests: &[ProposalRequest],
) -> Result<Vec<Proposal>> {
    let mut round = p.begin(requests)?;
    loop {
        match round {
            Round::Done(proposals) => return Ok(proposals),
            Round::Forward(read) => {
                let logits = read.wait(|| p.wait_device());
                round = p.resume(logits)?;
            }
        }
    }
}

/// Runs a round to the end, awaiting each forward's read-back (wasm + WebGPU).
pub async fn propose_awaiting(
    p: &mut dyn Proposer,
    requests: &[ProposalRequest<'_>],
) -> Result<Vec<Proposal>> {
    let mut round = p.begin(requests)?;
    loop {
        match round {
            Round::Done(proposals) => return Ok(proposals),
            Round::Forward(read) => {
                let logits = read.resolve().await;
                round = p.resume(logits)?;
            }
        }
    }
}

/// A proposer with the engine's speculation settings.
pub struct Speculator {
    pub proposer: Box<dyn Proposer>,
    pub num_speculative_tokens: usize,
    pub disable_by_batch_size: usize,
}

impl Speculator {
    pub fn new(proposer: Box<dyn Proposer>, config: &SpeculativeConfig) -> Result<Self> {
        config.method()?;
        Ok(Speculator {
            proposer,
            num_speculative_tokens: config.num_speculative_tokens,
            disable_by_batch_size: config.disable_by_batch_size(),
        })
    }
}

/// Counters since start-up (vLLM's `spec_decode` series).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SpecDecodeStats {
    /// Sequence-steps that verified at least one proposal.
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// Accepted proposals by their position in the draft.
    pub accepted_per_position: [u64; MAX_SPECULATIVE_TOKENS],
    /// Steps where speculation was off because the batch was large.
    pub disabled_steps: u64,
    /// Time spent proposing (draft model forwards, n-gram lookups).
    pub propose_micros: u64,
}

impl SpecDecodeStats {
    /// Accepted proposals over proposed ones.
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.num_draft_tokens > 0)
            .then(|| self.num_accepted_tokens as f64 / self.num_draft_tokens as f64)
    }

    /// Tokens each verified draft produced: the accepted ones plus the target's own (vLLM's
    /// mean acceptance length).
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        (self.num_drafts > 0)
            .then(|| 1.0 + self.num_accepted_tokens as f64 / self.num_drafts as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_parse_as_vllm_spells_them() {
        let c = SpeculativeConfig::from_json(
            r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}"#,
        )
        .unwrap();
        assert_eq!(c.method().unwrap(), SpecMethod::Ngram { min: 4, max: 4 });
        let c = SpeculativeConfig::from_json(r#"{"model": "d.gguf", "num_speculative_tokens": 3}"#)
            .unwrap();
        assert_eq!(
            c.method().unwrap(),
            SpecMethod::Draft {
                model: "d.gguf".into()
            }
        );
        assert_eq!(c.disable_by_batch_size(), DEFAULT_DISABLE_BY_BATCH_SIZE);
    }

    #[test]
    fn bad_configs_name_the_key() {
        for (json, key) in [
            (
                r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
                "num_speculative_tokens",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 99}"#,
                "num_speculative_tokens",
            ),
            (
                r#"{"method": "eagle", "num_speculative_tokens": 2}"#,
                "eagle",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "typo": 1}"#,
                "typo",
            ),
            (r#"{"num_speculative_tokens": 2}"#, "method"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 2}"#,
                "prompt_lookup_min",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}"#,
                "disable_by_batch_size",
            ),
            (
                r#"{"model": "d", "num_speculative_tokens": 2, "prompt_lookup_max": 2}"#,
                "prompt_lookup_max",
            ),
            (r#"not json"#, "speculative_config"),
        ] {
            let e = SpeculativeConfig::from_json(json).unwrap_err().to_string();
            assert!(e.contains(key), "{json}: {e}");
        }
    }
}
