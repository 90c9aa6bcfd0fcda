//! Prompt lookup (vLLM's `ngram` method, llama.cpp's lookup decoding): find the sequence's
//! last n tokens earlier in its prompt or output and propose what followed them. No model,
//! so it costs microseconds; it pays off where the output copies its input (editing,
//! summarizing, code that repeats names).

use super::{Proposal, ProposalRequest, Proposer, Round};
use crate::error::Result;

pub struct NgramProposer {
    min: usize,
    max: usize,
}

impl NgramProposer {
    /// Matches n-grams of `min..=max` tokens, longest first.
    pub fn new(min: usize, max: usize) -> Self {
        NgramProposer {
            min: min.max(1),
            max: max.max(min.max(1)),
        }
    }

    /// What followed the latest earlier occurrence of the longest matching suffix.
    pub fn lookup(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        let len = tokens.len();
        if k == 0 {
            return Vec::new();
        }
        for n in (self.min..=self.max.min(len.saturating_sub(1))).rev() {
            let suffix = &tokens[len - n..];
            // Latest first: recent text predicts the next tokens best. A match must end
            // before the suffix itself starts, so at least one token follows it.
            let found = (0..len - n)
                .rev()
                .find(|&start| &tokens[start..start + n] == suffix);
            if let Some(start) = found {
                let from = start + n;
                return tokens[from..(from + k).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

impl Proposer for NgramProposer {
    fn begin(&mut self, requests: &[ProposalRequest]) -> Result<Round> {
        Ok(Round::Done(
            requests
                .iter()
                .map(|r| Proposal::deterministic(self.lookup(r.tokens, r.max_tokens)))
                .collect(),
        ))
    }

    fn name(&self) -> &'static str {
        "ngram"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_longest_match() {
        let p = NgramProposer::new(1, 3);
        // "1 2 3" recurs at the end: the latest earlier "1 2 3" is followed by 9 9.
        let t = [1, 2, 3, 4, 5, 1, 2, 3, 9, 9, 7, 1, 2, 3];
        assert_eq!(p.lookup(&t, 2), [9, 9]);
        assert_eq!(p.lookup(&t, 10), [9, 9, 7, 1, 2, 3]);
        // Only a 1-gram matches: what followed the latest 8.
        assert_eq!(p.lookup(&[8, 5, 6, 8, 4, 8], 2), [4, 8]);
        assert!(p.lookup(&[1, 2, 3], 4).is_empty());
        assert!(p.lookup(&[1], 4).is_empty());
        assert!(p.lookup(&t, 0).is_empty());
    }

    #[test]
    fn respects_the_shortest_n() {
        let p = NgramProposer::new(2, 3);
        assert!(
            p.lookup(&[8, 5, 6, 8], 2).is_empty(),
            "only a 1-gram matches"
        );
        assert_eq!(p.lookup(&[8, 5, 6, 8, 5], 2), [6, 8]);
    }
}
