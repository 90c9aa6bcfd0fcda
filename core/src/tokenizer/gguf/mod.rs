//! Builds a `tokenizers` tokenizer from GGUF metadata, reproducing what the model's HF
//! `tokenizer.json` does: byte-level BPE from the vocab and merges, the pre-tokenizer named by
//! `tokenizer.ggml.pre`, and control / user-defined tokens as added tokens.

mod spm;

use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::config::MAX_VOCAB;
use crate::error::{InferError, Result};
use crate::gguf::{GgufFile, GgufValue};

/// Llama 3's split regex (`llama-bpe`), as in its tokenizer.json.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split regex: like Llama 3's but one digit at a time.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

pub(super) fn tok_err(g: &GgufFile, what: String) -> InferError {
    InferError::Tokenizer(format!("{}: {what}", g.path.display()))
}

pub(super) fn string_array<'a>(g: &'a GgufFile, key: &str) -> Result<Vec<&'a str>> {
    let arr = g
        .get(key)
        .and_then(GgufValue::as_array)
        .ok_or_else(|| tok_err(g, format!("metadata `{key}` is missing")))?;
    arr.iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| tok_err(g, format!("`{key}` holds a non-string")))
        })
        .collect()
}

pub(super) struct GgufTokenizerParts {
    pub tokenizer: tokenizers::Tokenizer,
    pub bos: Option<u32>,
    pub eos_ids: Vec<u32>,
    pub add_bos: bool,
}

/// A BPE tokenizer over the GGUF vocabulary (a token's id is its position in `tokens`).
/// `byte_fallback` maps bytes with no piece to `<0xXX>` tokens, as SentencePiece does.
pub(super) fn bpe_over_vocab(
    g: &GgufFile,
    tokens: &[&str],
    merges: Vec<(String, String)>,
    unk: Option<String>,
    byte_fallback: bool,
) -> Result<tokenizers::Tokenizer> {
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .zip(0u32..)
        .map(|(t, i)| (t.to_string(), i))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(byte_fallback)
        .byte_fallback(byte_fallback);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder
        .build()
        .map_err(|e| tok_err(g, format!("building BPE: {e}")))?;
    Ok(tokenizers::Tokenizer::new(bpe))
}

/// Byte-level BPE (GPT-2 style) with the pre-tokenizer named by `tokenizer.ggml.pre`.
fn byte_level_bpe(
    g: &GgufFile,
    tokens: &[&str],
    unk: Option<String>,
) -> Result<tokenizers::Tokenizer> {
    let merges = string_array(g, "tokenizer.ggml.merges")?;
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| tok_err(g, format!("merge `{m}` has no space")))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut tk = bpe_over_vocab(g, tokens, merges, unk, false)?;

    let pre = g
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    // llama.cpp prepends no space to byte-level BPE text whatever this says; a file asking for
    // one asks for something neither runs.
    if g.get("tokenizer.ggml.add_space_prefix")
        .and_then(GgufValue::as_bool)
        == Some(true)
    {
        return Err(tok_err(
            g,
            "`tokenizer.ggml.add_space_prefix` is true for a byte-level BPE vocabulary (llama.cpp ignores it there; infer does not guess)".into(),
        ));
    }
    // Byte-level BPE ranks by its merge list; llama.cpp keeps any scores unused.
    g.get("tokenizer.ggml.scores");
    let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
        let s = Split::new(
            SplitPattern::Regex(pattern.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| tok_err(g, format!("split regex: {e}")))?;
        Ok(s.into())
    };
    let pre_tokenizer: PreTokenizerWrapper = match pre {
        // GPT-2 regex over raw text, digits first split one by one (SmolLM, StarCoder).
        "smollm" | "starcoder" | "refact" => Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        "llama-bpe" | "llama3" => Sequence::new(vec![split(LLAMA3_PATTERN)?, ByteLevel::new(false, true, false).into()]).into(),
        "qwen2" => {
            tk.with_normalizer(Some(NFC));
            Sequence::new(vec![split(QWEN2_PATTERN)?, ByteLevel::new(false, false, false).into()]).into()
        }
        "default" | "gpt-2" | "gpt2" => ByteLevel::new(false, true, true).into(),
        other => {
            return Err(tok_err(
                g,
                format!("pre-tokenizer `{other}` is not supported (supported: smollm, llama-bpe, qwen2, default)"),
            ))
        }
    };
    tk.with_pre_tokenizer(Some(pre_tokenizer));
    tk.with_decoder(Some(ByteLevel::default()));

    Ok(tk)
}

pub(super) fn build(g: &GgufFile) -> Result<GgufTokenizerParts> {
    let model = g
        .get("tokenizer.ggml.model")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let tokens = string_array(g, "tokenizer.ggml.tokens")?;
    // Token ids are u32 (and a model's vocabulary is far smaller: `ModelConfig::check_limits`).
    if tokens.len() > MAX_VOCAB {
        return Err(tok_err(
            g,
            format!("{} tokens (at most {MAX_VOCAB})", tokens.len()),
        ));
    }
    let token_id = |key: &str| {
        g.get(key)
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
    };
    let unk = token_id("tokenizer.ggml.unknown_token_id")
        .and_then(|i| tokens.get(i as usize))
        .map(|t| t.to_string());
    // SentencePiece ranks by score and splits no text before it: llama.cpp reads neither
    // merges nor a pre-tokenizer for it.
    if model == "llama" {
        g.get("tokenizer.ggml.merges");
        g.get("tokenizer.ggml.pre");
    }
    // llama.cpp adds a BOS by default for SentencePiece models only.
    let (mut tk, default_add_bos) = match model {
        "gpt2" => (byte_level_bpe(g, &tokens, unk)?, false),
        "llama" => (spm::build(g, &tokens, unk)?, true),
        other => {
            return Err(tok_err(
                g,
                format!("tokenizer model `{other}` is not supported (supported: gpt2 byte-level BPE, llama SentencePiece BPE)"),
            ))
        }
    };

    // Control tokens are special (matched whole in text, skippable on decode); user-defined
    // tokens are matched whole but decoded like text.
    if let Some(types) = g
        .get("tokenizer.ggml.token_type")
        .and_then(GgufValue::as_array)
    {
        let mut special = Vec::new();
        let mut user = Vec::new();
        for (tok, ty) in tokens.iter().zip(types) {
            match ty.as_u64().map(|t| t as i64) {
                Some(TOKEN_TYPE_CONTROL) => special.push(AddedToken::from(tok.to_string(), true)),
                Some(TOKEN_TYPE_USER_DEFINED) => {
                    user.push(AddedToken::from(tok.to_string(), false))
                }
                _ => {}
            }
        }
        tk.add_special_tokens(&special);
        tk.add_tokens(&user);
    }

    let bos = token_id("tokenizer.ggml.bos_token_id");
    let add_bos = g
        .get("tokenizer.ggml.add_bos_token")
        .and_then(GgufValue::as_bool)
        .unwrap_or(default_add_bos);
    // llama.cpp appends the EOS token to every tokenized prompt when the file asks (some
    // embedding models are trained so).
    let add_eos = g
        .get("tokenizer.ggml.add_eos_token")
        .and_then(GgufValue::as_bool)
        .unwrap_or(false);
    let eos = token_id("tokenizer.ggml.eos_token_id");
    let text_of = |what: &str, id: Option<u32>| -> Result<String> {
        let id = id.ok_or_else(|| tok_err(g, format!("add_{what}_token without a {what} id")))?;
        tokens
            .get(id as usize)
            .map(|t| t.to_string())
            .ok_or_else(|| tok_err(g, format!("{what} id {id} outside the vocab")))
    };
    let bos_text = if add_bos && bos.is_some() {
        Some(text_of("bos", bos)?)
    } else {
        None
    };
    let eos_text = if add_eos {
        Some(text_of("eos", eos)?)
    } else {
        None
    };
    if bos_text.is_some() || eos_text.is_some() {
        let mut special = Vec::new();
        let (mut single, mut pair) = (Vec::new(), Vec::new());
        if let (Some(t), Some(id)) = (&bos_text, bos) {
            special.push((t.clone(), id));
            single.push(t.clone());
        }
        single.push("$A".to_string());
        if let (Some(t), Some(id)) = (&eos_text, eos) {
            if !special.iter().any(|(_, i)| *i == id) {
                special.push((t.clone(), id));
            }
            single.push(t.clone());
        }
        pair.extend(single.iter().cloned());
        pair.extend(
            single
                .iter()
                .map(|p| if p == "$A" { "$B".into() } else { p.clone() }),
        );
        let post = TemplateProcessing::builder()
            .try_single(single.join(" "))
            .and_then(|b| b.try_pair(pair.join(" ")))
            .map_err(|e| tok_err(g, format!("bos/eos template: {e}")))?
            .special_tokens(special)
            .build()
            .map_err(|e| tok_err(g, format!("bos/eos template: {e}")))?;
        tk.with_post_processor(Some(post));
    }

    let mut eos_ids = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = token_id(key).filter(|id| !eos_ids.contains(id)) {
            eos_ids.push(id);
        }
    }
    Ok(GgufTokenizerParts {
        tokenizer: tk,
        bos,
        eos_ids,
        add_bos,
    })
}
