//! `infer tokenizer export`: the folder reloads (through infer's own Hugging Face loader, a
//! different path from the GGUF one) into a tokenizer with the GGUF's ids, special tokens and
//! chat template.

use std::process::Command;

use infer_core::{ChatMessage, Tokenizer};
use infer_tests::smollm2_path;

#[test]
fn the_exported_folder_tokenizes_as_the_gguf_does() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["tokenizer", "export", &smollm2_path()])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        assert!(dir.path().join(file).is_file(), "{file}");
    }
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["tokenizer_class"], "PreTrainedTokenizerFast");
    assert!(config["model_max_length"].as_u64().unwrap() > 0);

    let (_, gguf) = infer_tests::smollm2_shared();
    let hf = Tokenizer::from_hf_dir(dir.path(), &[]).unwrap();
    for text in [
        "Hello, world!",
        "  two spaces\tand\nnewlines, é 日本語 😀",
        "<|im_start|>user\nhi<|im_end|>",
    ] {
        for special in [true, false] {
            assert_eq!(
                hf.encode(text, special).unwrap(),
                gguf.encode(text, special).unwrap(),
                "{text:?}"
            );
        }
    }
    assert_eq!(hf.chat_template(), gguf.chat_template());
    assert_eq!(hf.eos_token_ids(), gguf.eos_token_ids());
    let msgs = [ChatMessage::user("What is 2+2?")];
    assert_eq!(
        hf.apply_chat_template(&msgs, true).unwrap(),
        gguf.apply_chat_template(&msgs, true).unwrap()
    );
}
