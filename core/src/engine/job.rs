//! A logits row that samples this step and what it belongs to, shared by the step's
//! processing (`process`) and speculative decoding (`speculate`), which builds the rows that
//! verify a draft.

use super::request::Request;
use crate::block_manager::SeqId;

/// A logits row that samples, and what it belongs to.
pub(super) struct Job {
    pub key: u64,
    /// Position in the request's live members.
    pub member: usize,
    pub row: usize,
    pub uniforms: Vec<f64>,
    /// Speculative decoding: the proposal this row verifies and where it is in its draft.
    pub spec: Option<SpecCursor>,
}

/// A speculating sequence's place in its draft: row `position` of its `1 + k` rows.
#[derive(Debug, Clone)]
pub(super) struct SpecCursor {
    pub seq: SeqId,
    pub position: usize,
    pub proposals: Vec<u32>,
    /// The proposals' q rows when they were sampled (empty: one-hot).
    pub probs: Vec<f32>,
}

impl Job {
    pub(super) fn proposal(&self) -> Option<u32> {
        let s = self.spec.as_ref()?;
        s.proposals.get(s.position).copied()
    }

    /// q of the proposal this row verifies, when it was sampled.
    pub(super) fn proposal_probs(&self, vocab: usize) -> Option<&[f32]> {
        let s = self.spec.as_ref()?;
        s.probs.get(s.position * vocab..(s.position + 1) * vocab)
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
