//! Reasoning output (vLLM's `--reasoning-parser`): a thinking model writes its reasoning
//! inside `<think>…</think>` before the answer; the reply carries it apart, in
//! `reasoning_content`, and the answer alone in `content`, whole or as stream deltas.

/// How a model marks its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// DeepSeek-R1 (and QwQ, Qwen3-Thinking): the template opens `<think>` in the prompt, so
    /// the output is reasoning up to `</think>` (a `<think>` it writes itself is dropped);
    /// with no `</think>` at all, the whole output is reasoning.
    DeepSeekR1,
    /// Qwen3: reasoning only when the output opens with `<think>` (with `enable_thinking:
    /// false` the template closes an empty block in the prompt and the output is all answer).
    Qwen3,
}

const START: &str = "<think>";
const END: &str = "</think>";

impl ReasoningParser {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "deepseek_r1" => Some(ReasoningParser::DeepSeekR1),
            "qwen3" => Some(ReasoningParser::Qwen3),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ReasoningParser::DeepSeekR1 => "deepseek_r1",
            ReasoningParser::Qwen3 => "qwen3",
        }
    }

    /// A whole output as (reasoning, content).
    pub fn split(self, text: &str) -> (Option<String>, String) {
        let mut stream = ReasoningStream::new(self);
        let (reasoning, content) = stream.push(text, true);
        let reasoning = (stream.reasoned).then_some(reasoning);
        (reasoning, content)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing decided yet (Qwen3: whether the output opens a block).
    Start,
    Reasoning,
    Content,
}

/// One choice's output as it streams: each delta split into its reasoning and content parts,
/// holding back text that may be the start of a tag until the next delta settles it.
#[derive(Debug, Clone)]
pub struct ReasoningStream {
    phase: Phase,
    held: String,
    /// Whether the output had a reasoning part (even an empty one).
    reasoned: bool,
    /// Whether a `<think>` the output opens with has been looked for (and dropped).
    opening_checked: bool,
}

/// The length of the longest suffix of `text` that begins `tag` (a tag possibly cut by the
/// delta boundary).
fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

impl ReasoningStream {
    pub fn new(parser: ReasoningParser) -> Self {
        ReasoningStream {
            phase: match parser {
                ReasoningParser::DeepSeekR1 => Phase::Reasoning,
                ReasoningParser::Qwen3 => Phase::Start,
            },
            held: String::new(),
            reasoned: parser == ReasoningParser::DeepSeekR1,
            opening_checked: false,
        }
    }

    /// The (reasoning, content) text `delta` completes; `last`: no more will come.
    pub fn push(&mut self, delta: &str, last: bool) -> (String, String) {
        self.held.push_str(delta);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match self.phase {
                Phase::Start => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(START) {
                        self.held = rest.to_string();
                        self.phase = Phase::Reasoning;
                        self.reasoned = true;
                        self.opening_checked = true;
                    } else if !last && START.starts_with(trimmed) {
                        return (reasoning, content); // maybe `<think>` still coming
                    } else {
                        self.phase = Phase::Content;
                    }
                }
                Phase::Reasoning => {
                    // DeepSeek-R1 may open the block itself, too.
                    if !self.opening_checked {
                        let trimmed = self.held.trim_start();
                        if let Some(rest) = trimmed.strip_prefix(START) {
                            self.held = rest.to_string();
                        } else if !last && START.starts_with(trimmed) {
                            return (reasoning, content); // maybe `<think>` still coming
                        }
                        self.opening_checked = true;
                    }
                    if let Some(at) = self.held.find(END) {
                        reasoning.push_str(&self.held[..at]);
                        self.held = self.held[at + END.len()..].to_string();
                        self.phase = Phase::Content;
                        continue;
                    }
                    let keep = if last {
                        0
                    } else {
                        partial_tag(&self.held, END)
                    };
                    let cut = self.held.len() - keep;
                    reasoning.push_str(&self.held[..cut]);
                    self.held.drain(..cut);
                    return (reasoning, content);
                }
                Phase::Content => {
                    content.push_str(&self.held);
                    self.held.clear();
                    return (reasoning, content);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_outputs_split_as_vllm_splits_them() {
        let r1 = ReasoningParser::DeepSeekR1;
        assert_eq!(
            r1.split("Let me see.</think>Paris."),
            (Some("Let me see.".into()), "Paris.".into())
        );
        assert_eq!(
            r1.split("<think>Hm</think>Yes"),
            (Some("Hm".into()), "Yes".into())
        );
        assert_eq!(
            r1.split("no end yet"),
            (Some("no end yet".into()), String::new())
        );
        let q = ReasoningParser::Qwen3;
        assert_eq!(
            q.split("<think>\nHm\n</think>\n\nYes"),
            (Some("\nHm\n".into()), "\n\nYes".into())
        );
        assert_eq!(q.split("Just the answer"), (None, "Just the answer".into()));
    }

    #[test]
    fn streamed_deltas_give_the_same_split_whatever_the_cuts() {
        for parser in [ReasoningParser::DeepSeekR1, ReasoningParser::Qwen3] {
            for text in [
                "<think>Let me see, é.</think>Paris, é.",
                "Weighing it</think>Yes",
                "plain answer",
                "<thi",
            ] {
                let whole = parser.split(text);
                for step in 1..5 {
                    let mut s = ReasoningStream::new(parser);
                    let (mut r, mut c) = (String::new(), String::new());
                    let chars: Vec<char> = text.chars().collect();
                    let pieces: Vec<String> =
                        chars.chunks(step).map(|p| p.iter().collect()).collect();
                    for (i, piece) in pieces.iter().enumerate() {
                        let (dr, dc) = s.push(piece, i + 1 == pieces.len());
                        r.push_str(&dr);
                        c.push_str(&dc);
                    }
                    assert_eq!(
                        (whole.0.clone().unwrap_or_default(), whole.1.clone()),
                        (r, c),
                        "{parser:?} {text:?} by {step}"
                    );
                }
            }
        }
    }
}
