//! Beam search bookkeeping (as in Hugging Face `BeamSearchScorer` and vLLM's engine): which
//! candidates become the next beams, which finish, and when the search is over. The engine
//! maps the choice onto sequences: a beam chosen twice forks (its blocks shared, copy-on-write),
//! a beam not chosen is freed.

/// A one-token extension of a live beam.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Index of the live beam it extends.
    pub parent: usize,
    pub token: u32,
    pub cumulative_logprob: f64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct BeamChoice {
    /// The next live beams, best first (at most the width).
    pub next: Vec<Candidate>,
    /// Candidates that end with a stop token and rank within the width: finished hypotheses.
    pub finished: Vec<Candidate>,
}

/// `cumulative_logprob / generated_len ^ length_penalty` (generated tokens, a final EOS
/// included): penalty > 1 favours longer outputs, < 1 shorter ones.
pub fn beam_score(cumulative_logprob: f64, generated_len: usize, length_penalty: f32) -> f64 {
    cumulative_logprob / (generated_len.max(1) as f64).powf(length_penalty as f64)
}

/// Ranks every live beam's top `2 * width` extensions by cumulative logprob (ties: lower
/// beam, then lower token) and walks them best first: a stop-token candidate ranked within
/// the width finishes, the others fill the next beams until `width` of them are found.
pub fn choose(
    live_cumulative: &[f64],
    tops: &[Vec<(u32, f32)>],
    width: usize,
    is_stop: impl Fn(u32) -> bool,
) -> BeamChoice {
    let mut all: Vec<Candidate> = live_cumulative
        .iter()
        .zip(tops)
        .enumerate()
        .flat_map(|(parent, (&cum, top))| {
            top.iter().map(move |&(token, lp)| Candidate {
                parent,
                token,
                cumulative_logprob: cum + lp as f64,
            })
        })
        .collect();
    all.sort_by(|a, b| {
        b.cumulative_logprob
            .total_cmp(&a.cumulative_logprob)
            .then(a.parent.cmp(&b.parent))
            .then(a.token.cmp(&b.token))
    });
    let mut choice = BeamChoice::default();
    for (rank, c) in all.into_iter().enumerate() {
        if choice.next.len() == width {
            break;
        }
        if is_stop(c.token) {
            if rank < width {
                choice.finished.push(c);
            }
        } else {
            choice.next.push(c);
        }
    }
    choice
}

/// Whether the search is over given the finished hypotheses' scores and the best live beam.
/// `early_stopping`: as soon as `width` hypotheses exist. Otherwise (Hugging Face's
/// heuristic) once the best live beam, scored at its current length, cannot beat the
/// width-th best hypothesis.
pub fn search_done(
    finished_scores: &[f64],
    best_live: Option<(f64, usize)>,
    width: usize,
    length_penalty: f32,
    early_stopping: bool,
) -> bool {
    let Some((cum, len)) = best_live else {
        return true;
    };
    if finished_scores.len() < width {
        return false;
    }
    if early_stopping {
        return true;
    }
    let mut sorted = finished_scores.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    sorted[width - 1] >= beam_score(cum, len, length_penalty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chooses_best_extensions_across_beams_and_finishes_stops_within_width() {
        // Beam 0 at -1.0, beam 1 at -2.0; token 9 is EOS.
        let tops = vec![
            vec![(9, -0.1), (3, -0.5), (4, -3.0), (5, -4.0)],
            vec![(3, -0.2), (6, -0.3), (9, -2.0), (7, -5.0)],
        ];
        let c = choose(&[-1.0, -2.0], &tops, 2, |t| t == 9);
        assert_eq!(c.finished.len(), 1);
        assert_eq!((c.finished[0].parent, c.finished[0].token), (0, 9));
        assert!((c.finished[0].cumulative_logprob + 1.1).abs() < 1e-6);
        let next: Vec<_> = c.next.iter().map(|c| (c.parent, c.token)).collect();
        assert_eq!(next, [(0, 3), (1, 3)]);
        // An EOS ranked past the width is dropped, not finished.
        let c = choose(&[0.0], &[vec![(1, -0.1), (2, -0.2), (9, -0.3)]], 2, |t| {
            t == 9
        });
        assert!(c.finished.is_empty());
        assert_eq!(c.next.len(), 2);
    }

    #[test]
    fn done_rules() {
        assert!(!search_done(&[-1.0], Some((-0.5, 3)), 2, 1.0, false));
        assert!(search_done(&[-1.0, -2.0], Some((-0.5, 3)), 2, 1.0, true));
        // Best live scores -9/3 = -3 < -2: cannot catch up.
        assert!(search_done(&[-1.0, -2.0], Some((-9.0, 3)), 2, 1.0, false));
        assert!(!search_done(&[-1.0, -2.0], Some((-3.0, 3)), 2, 1.0, false));
        assert!(search_done(&[], None, 2, 1.0, false));
        assert_eq!(beam_score(-6.0, 3, 1.0), -2.0);
        assert_eq!(beam_score(-6.0, 4, 0.0), -6.0);
    }
}
