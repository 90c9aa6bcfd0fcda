//! Incremental detokenization with prefix/read offsets (as vLLM and TGI do): each new token
//! decodes only a short window, and text is emitted only once it is complete UTF-8, so a
//! character split across byte-level tokens never shows up as U+FFFD in a delta.

use super::Tokenizer;
use crate::error::Result;

#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    ids: Vec<u32>,
    /// Start of the window decoded for context (so leading spaces render right).
    prefix_offset: usize,
    /// End of the text already emitted.
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDetokenizer {
    /// `context` is the prompt's tail: it conditions how the first generated tokens render.
    pub fn new(context: &[u32], skip_special_tokens: bool) -> Self {
        // A few tokens of context are enough for byte-level BPE and SentencePiece.
        let start = context.len().saturating_sub(5);
        let ids = context[start..].to_vec();
        let n = ids.len();
        IncrementalDetokenizer {
            ids,
            prefix_offset: 0,
            read_offset: n,
            skip_special_tokens,
        }
    }

    /// Adds one token and returns the newly completed text (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let prefix = tokenizer.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        if full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && full.is_char_boundary(prefix.len())
        {
            let delta = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            // Keep the window short: drop ids before the new prefix.
            if self.prefix_offset > 64 {
                self.ids.drain(..self.prefix_offset);
                self.read_offset -= self.prefix_offset;
                self.prefix_offset = 0;
            }
            return Ok(delta);
        }
        Ok(String::new())
    }
}
