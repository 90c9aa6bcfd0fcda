//! Steps paced by time: the chunked-prefill token budget follows the measured cost of a token
//! on this backend, so a step (and so every running stream's gap between tokens) stays near a
//! target latency however long the prompts being admitted are. vLLM's fixed budget is tuned for
//! GPUs; on a CPU one 2048-token chunk of a long prompt takes seconds.

use std::time::Duration;

/// Steps with fewer tokens say little about a token's cost (fixed per-step overheads dominate).
const MIN_MEASURED_TOKENS: usize = 16;
/// A prompt's chunk advances by at least this many tokens a step.
const MIN_CHUNK: usize = 16;
/// The budget before anything has been measured.
const FIRST_BUDGET: usize = 256;

/// The token budget of the next step from the cost of the last ones.
#[derive(Debug, Clone)]
pub struct StepPacer {
    target: Duration,
    /// Seconds per token, a moving average over recent steps (attention makes a token dearer
    /// as a prompt's chunks go deeper, so recent steps weigh most).
    secs_per_token: Option<f64>,
}

impl StepPacer {
    pub fn new(target: Duration) -> Self {
        StepPacer {
            target,
            secs_per_token: None,
        }
    }

    /// The next step's token budget: what fits the target at the measured cost, never below a
    /// token for each decoding sequence plus a chunk's minimum, never above `cap`.
    pub fn budget(&self, decoding: usize, cap: usize) -> usize {
        let paced = match self.secs_per_token {
            None => FIRST_BUDGET,
            // Saturates (a float past usize becomes usize::MAX), then `cap` bounds it.
            #[expect(clippy::cast_possible_truncation, reason = "saturating, then capped")]
            Some(per) => (self.target.as_secs_f64() / per.max(1e-9)) as usize,
        };
        paced.max(decoding + MIN_CHUNK).min(cap)
    }

    /// Records a step of `tokens` tokens that took `elapsed`.
    pub fn record(&mut self, tokens: usize, elapsed: Duration) {
        if tokens < MIN_MEASURED_TOKENS {
            return;
        }
        let per = elapsed.as_secs_f64() / tokens as f64;
        self.secs_per_token = Some(match self.secs_per_token {
            None => per,
            Some(avg) => 0.5 * avg + 0.5 * per,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_follows_the_measured_cost_within_its_bounds() {
        let mut p = StepPacer::new(Duration::from_millis(250));
        assert_eq!(p.budget(0, 2048), FIRST_BUDGET);
        // 1 ms a token: 250 tokens fit the target.
        p.record(100, Duration::from_millis(100));
        assert_eq!(p.budget(0, 2048), 250);
        // Dearer tokens (deeper chunks) lower it; the average moves halfway.
        p.record(100, Duration::from_millis(300));
        assert_eq!(p.budget(0, 2048), 125);
        // Never below a token per decoding sequence plus a chunk's minimum, never above the cap.
        assert_eq!(p.budget(500, 2048), 500 + MIN_CHUNK);
        for _ in 0..16 {
            p.record(1000, Duration::from_micros(10));
        }
        assert_eq!(p.budget(0, 2048), 2048);
        // Tiny steps are not measured.
        let before = p.budget(0, 1 << 30);
        p.record(2, Duration::from_secs(10));
        assert_eq!(p.budget(0, 1 << 30), before);
    }
}
