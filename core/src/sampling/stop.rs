//! A sequence's output text with stop strings: matched across token boundaries, cut from the
//! text, and never half-streamed (the last `longest stop - 1` bytes are held back until they
//! can no longer start a match).

/// Generated text and how much of it was streamed.
#[derive(Debug, Clone, Default)]
pub struct OutputText {
    text: String,
    emitted: usize,
}

impl OutputText {
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Appends newly decoded text; returns the index of the stop string it completed, the
    /// text then ending just before that string's first occurrence (just after it with
    /// `keep_stop`, vLLM's `include_stop_str_in_output`).
    pub fn push(&mut self, delta: &str, stops: &[String], keep_stop: bool) -> Option<usize> {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        // A new match must end inside `delta`, so it starts at most `longest - 1` bytes back.
        let start = floor_char_boundary(
            &self.text,
            self.text.len().saturating_sub(longest.saturating_sub(1)),
        );
        self.text.push_str(delta);
        let window = &self.text[start..];
        let (at, index) = stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| window.find(s.as_str()).map(|at| (at, i)))
            .min()?;
        let kept = if keep_stop { stops[index].len() } else { 0 };
        self.text.truncate(start + at + kept);
        self.emitted = self.emitted.min(self.text.len());
        Some(index)
    }

    /// Text not streamed yet, keeping back `hold` bytes that may begin a stop string (none
    /// once `finished`).
    pub fn take_delta(&mut self, hold: usize, finished: bool) -> String {
        let end = if finished {
            self.text.len()
        } else {
            floor_char_boundary(&self.text, self.text.len().saturating_sub(hold))
        };
        if end <= self.emitted {
            return String::new();
        }
        let delta = self.text[self.emitted..end].to_string();
        self.emitted = end;
        delta
    }
}

/// Bytes to hold back while streaming with these stop strings.
pub fn holdback(stops: &[String]) -> usize {
    stops.iter().map(String::len).max().unwrap_or(1) - 1
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_across_pieces_is_cut_and_never_streamed() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        let hold = holdback(&stops);
        let mut t = OutputText::default();
        let mut streamed = String::new();
        for piece in ["Hello", " wor", "ld E", "N"] {
            assert_eq!(t.push(piece, &stops, false), None);
            streamed += &t.take_delta(hold, false);
        }
        // "EN" may begin "END": held back.
        assert_eq!(streamed, "Hello world ");
        assert_eq!(t.push("D and more", &stops, false), Some(0));
        streamed += &t.take_delta(hold, true);
        assert_eq!(streamed, "Hello world ");
        assert_eq!(t.text(), "Hello world ");
    }

    #[test]
    fn earliest_match_wins_and_multibyte_text_is_held_on_char_boundaries() {
        let stops = vec!["ab".to_string(), "b".to_string()];
        let mut t = OutputText::default();
        assert_eq!(t.push("xxab", &stops, false), Some(0));
        assert_eq!(t.text(), "xx");

        let stops = vec!["日本語".to_string()];
        let mut t = OutputText::default();
        t.push("é日本", &stops, false);
        // 8 bytes held would split "é": the boundary moves back.
        assert_eq!(t.take_delta(holdback(&stops), false), "");
        assert_eq!(t.push("語", &stops, false), Some(0));
        assert_eq!(t.take_delta(holdback(&stops), true), "é");
    }

    #[test]
    fn a_kept_stop_string_ends_the_text() {
        let stops = vec!["END".to_string()];
        let mut t = OutputText::default();
        assert_eq!(t.push("abc E", &stops, true), None);
        assert_eq!(t.push("ND tail", &stops, true), Some(0));
        assert_eq!(t.text(), "abc END");
    }
}
