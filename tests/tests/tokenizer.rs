//! Tokenizer behaviour beyond the reference ids: streaming detokenization, special tokens,
//! and the pre-tokenizers named in GGUF metadata.

use infer_core::tokenizer::IncrementalDetokenizer;
use infer_core::Tokenizer;
use infer_tests::gguf_writer::{tiny_llama, Meta};
use infer_tests::{load_cpu, smollm2_path};
use tokenizers::PreTokenizer;

fn stream(tk: &Tokenizer, prompt: &[u32], ids: &[u32]) -> Vec<String> {
    let mut d = IncrementalDetokenizer::new(prompt, true);
    ids.iter().map(|&id| d.push(tk, id).unwrap()).collect()
}

#[test]
fn streaming_emoji_and_cjk_never_shows_replacement_chars() {
    let m = load_cpu(&smollm2_path());
    let tk = &m.tokenizer;
    for text in [
        "🎉🚀 party time 👩‍💻",
        "日本語のテキストと中文字符",
        " naïve café — Привет, мир! 안녕하세요",
        "Mixed 😀 text 你好 and numbers 12345",
    ] {
        let ids = tk.encode(text, false).unwrap();
        // Byte-level BPE splits these characters over several tokens.
        assert!(ids.len() > text.chars().count() / 2, "{text}: {ids:?}");
        let prompt = tk.encode("Say:", false).unwrap();
        let deltas = stream(tk, &prompt, &ids);
        for d in &deltas {
            assert!(!d.contains('\u{FFFD}'), "{text}: delta {d:?}");
        }
        assert_eq!(deltas.concat(), tk.decode(&ids, true).unwrap(), "{text}");
        assert_eq!(deltas.concat(), text);
    }
}

#[test]
fn special_tokens_are_single_ids_and_skippable() {
    let m = load_cpu(&smollm2_path());
    let tk = &m.tokenizer;
    let ids = tk.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(tk.decode(&ids, true).unwrap(), "user\nHi");
    assert_eq!(tk.eos_token_ids(), [2]);
    // No BOS is added for SmolLM2 (tokenizer.ggml.add_bos_token = false).
    assert_eq!(
        tk.encode("Hi", true).unwrap(),
        tk.encode("Hi", false).unwrap()
    );
}

fn pre_tokens(tk: &Tokenizer, text: &str) -> Vec<String> {
    let mut s = tokenizers::PreTokenizedString::from(text);
    tk.inner()
        .get_pre_tokenizer()
        .unwrap()
        .pre_tokenize(&mut s)
        .unwrap();
    s.get_splits(
        tokenizers::OffsetReferential::Original,
        tokenizers::OffsetType::Char,
    )
    .into_iter()
    .map(|(t, _, _)| t.to_string())
    .collect()
}

#[test]
fn pre_tokenizers_split_digits_as_their_models_do() {
    let dir = tempfile::tempdir().unwrap();
    let split = |pre: &str| {
        let mut w = tiny_llama(1);
        w.meta("tokenizer.ggml.pre", Meta::Str(pre.into()));
        let p = dir.path().join(format!("{pre}.gguf"));
        std::fs::write(&p, w.to_bytes()).unwrap();
        let files = infer_core::open_model(p.to_str().unwrap()).unwrap();
        pre_tokens(&files.tokenizer, "x 12345 don't")
    };
    // SmolLM: every digit alone, then GPT-2's regex.
    assert_eq!(
        split("smollm"),
        ["x", "Ġ", "1", "2", "3", "4", "5", "Ġdon", "'t"]
    );
    // Llama 3: digits in groups of three.
    assert_eq!(split("llama-bpe"), ["x", "Ġ", "123", "45", "Ġdon", "'t"]);
}

#[test]
fn bos_is_added_when_the_gguf_asks_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama(1);
    w.meta("tokenizer.ggml.add_bos_token", Meta::Bool(true));
    let p = dir.path().join("bos.gguf");
    std::fs::write(&p, w.to_bytes()).unwrap();
    let files = infer_core::open_model(p.to_str().unwrap()).unwrap();
    let ids = files.tokenizer.encode("hello", true).unwrap();
    assert_eq!(ids[0], 0, "{ids:?}");
    assert_eq!(files.tokenizer.encode("hello", false).unwrap(), ids[1..]);
}

/// llama.cpp appends EOS to a tokenized prompt when the file says `add_eos_token` (some
/// embedding models are trained so); infer does too, after any BOS.
#[test]
fn eos_is_appended_when_the_gguf_asks_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama(1);
    w.meta("tokenizer.ggml.add_bos_token", Meta::Bool(true))
        .meta("tokenizer.ggml.add_eos_token", Meta::Bool(true));
    let p = dir.path().join("eos.gguf");
    std::fs::write(&p, w.to_bytes()).unwrap();
    let files = infer_core::open_model(p.to_str().unwrap()).unwrap();
    let eos = files.tokenizer.eos_token_ids()[0];
    let ids = files.tokenizer.encode("hello", true).unwrap();
    assert_eq!((ids[0], ids[ids.len() - 1]), (0, eos), "{ids:?}");
    assert_eq!(
        files.tokenizer.encode("hello", false).unwrap(),
        ids[1..ids.len() - 1]
    );
}

#[derive(serde::Deserialize)]
struct SpmCase {
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

/// A SentencePiece-BPE GGUF (Llama 2 style) made by scripts/spm_fixture.py: ids as the
/// `sentencepiece` package gives them (llama.cpp agrees on every case), BOS included.
#[test]
fn sentencepiece_gguf_tokenizes_like_sentencepiece() {
    let dir = infer_tests::fixtures_dir().join("spm");
    let text = std::fs::read_to_string(dir.join("cases.json")).unwrap();
    let cases: Vec<SpmCase> = serde_json::from_value(
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["cases"].clone(),
    )
    .unwrap();
    let m = load_cpu(dir.join("tiny_spm.gguf").to_str().unwrap());
    let tk = &m.tokenizer;
    for case in &cases {
        let ids = tk.encode(&case.text, true).unwrap();
        assert_eq!(ids, case.ids, "{:?}", case.text);
        assert_eq!(
            tk.decode(&ids, true).unwrap(),
            case.decoded,
            "{:?}",
            case.text
        );
        let deltas = stream(tk, &ids[..1], &ids[1..]);
        assert_eq!(deltas.concat(), case.decoded, "streamed {:?}", case.text);
    }
    // The model behind it runs too.
    let params = infer_core::SamplingParams {
        ignore_eos: true,
        ..infer_core::SamplingParams::greedy(4)
    };
    assert_eq!(
        m.generate(&cases[0].ids, &params, &mut |_| {})
            .token_ids
            .len(),
        4
    );
}
