//! SentencePiece BPE tokenizers from GGUF (`tokenizer.ggml.model = llama`: Llama 2, Mistral
//! v0.1, TinyLlama…), built as HF's GGUF converter builds them: BPE whose merges rank pieces by
//! their SentencePiece score, byte fallback to `<0xXX>` pieces, spaces as `▁` with one
//! prepended, and the reverse on decode.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper};

use super::{bpe_over_vocab, tok_err};
use crate::error::Result;
use crate::gguf::{GgufFile, GgufValue};
use crate::narrow::f32_of;

const SPACE: &str = "▁";

pub(super) fn build(
    g: &GgufFile,
    tokens: &[&str],
    unk: Option<String>,
) -> Result<tokenizers::Tokenizer> {
    let scores: Vec<f32> = g
        .get("tokenizer.ggml.scores")
        .and_then(GgufValue::as_array)
        .ok_or_else(|| tok_err(g, "metadata `tokenizer.ggml.scores` is missing".into()))?
        .iter()
        .map(|v| v.as_f64().map(f32_of))
        .collect::<Option<_>>()
        .ok_or_else(|| tok_err(g, "`tokenizer.ggml.scores` holds a non-number".into()))?;
    if scores.len() != tokens.len() {
        return Err(tok_err(
            g,
            format!("{} scores for {} tokens", scores.len(), tokens.len()),
        ));
    }
    let merges = merges_by_score(tokens, &scores);
    let mut tk = bpe_over_vocab(g, tokens, merges, unk, true)?;

    let add_prefix = g
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(GgufValue::as_bool)
        .unwrap_or(true);
    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| tok_err(g, format!("normalizer: {e}")))
    };
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_prefix {
        normalizers.push(Prepend::new(SPACE.into()).into());
    }
    normalizers.push(replace(" ", SPACE)?.into());
    tk.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    let decoders: Vec<DecoderWrapper> = vec![
        replace(SPACE, " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
        Strip::new(' ', usize::from(add_prefix), 0).into(),
    ];
    tk.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tk)
}

/// Every split of a piece into two pieces of the vocabulary is a merge, ranked by the merged
/// piece's score (best first); splits of one piece are ordered by their halves' ids. This is
/// the `SentencePieceExtractor` rule HF uses, which reproduces SentencePiece's own merge order.
fn merges_by_score(tokens: &[&str], scores: &[f32]) -> Vec<(String, String)> {
    let vocab: HashMap<&str, u32> = tokens.iter().zip(0u32..).map(|(t, i)| (*t, i)).collect();
    let mut merges: Vec<(f32, u32, u32, &str, &str)> = Vec::new();
    for (piece, &score) in tokens.iter().zip(scores) {
        let mut local: Vec<(f32, u32, u32, &str, &str)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = piece.split_at(at);
                Some((score, *vocab.get(l)?, *vocab.get(r)?, l, r))
            })
            .collect();
        local.sort_by_key(|&(_, l, r, _, _)| (l, r));
        merges.extend(local);
    }
    // Stable: equal scores keep vocabulary order.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    merges
        .into_iter()
        .map(|(_, _, _, l, r)| (l.to_string(), r.to_string()))
        .collect()
}
