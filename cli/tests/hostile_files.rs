//! Issue 34: model files whose sizes lie. Each is refused with a clear error, quickly, and
//! within a bounded address space (`ulimit -v`): nothing is allocated from a size the file
//! merely claims.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use infer_tests::gguf_writer::{tiny_llama, Meta};

/// Address space the loader gets, KiB (the KV pool and swap space are set small): threads' stacks and allocator arenas are reserved
/// address space too, so this is well above what the tiny model needs, and far below what
/// trusting any of the sizes below would take.
const ADDRESS_SPACE_KIB: u64 = 3 << 20;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_string_lossy().into_owned()
}

/// Runs `infer generate` on `model` under the address-space limit; returns (success, stderr,
/// time taken).
fn generate(model: &str, extra: &str) -> (bool, String, Duration) {
    let exe = env!("CARGO_BIN_EXE_infer");
    let script = format!(
        "ulimit -v {ADDRESS_SPACE_KIB} && exec '{exe}' generate --model '{model}' --prompt hello --max-tokens 2 --threads 1 --num-kv-blocks 64 --swap-space 0 {extra}"
    );
    let started = Instant::now();
    let out = Command::new("sh")
        .args(["-c", &script])
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), stderr, started.elapsed())
}

fn expect_refused(model: &str, needle: &str) {
    let (ok, stderr, took) = generate(model, "");
    assert!(!ok, "{model}: loaded");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(
        !stderr.contains("memory allocation"),
        "allocation failure: {stderr}"
    );
    assert!(stderr.contains(needle), "expected {needle:?} in: {stderr}");
    eprintln!("{needle}: refused in {took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
}

#[test]
fn lying_sizes_are_refused_in_bounded_time_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    // The model itself loads under the limit (the limit is not what refuses the others).
    let good = write(dir.path(), "good.gguf", &tiny_llama(1).to_bytes());
    let (ok, stderr, _) = generate(&good, "");
    assert!(ok, "the tiny model failed under the limit: {stderr}");

    let mut w = tiny_llama(1);
    w.meta("llama.block_count", Meta::U32(1 << 31));
    let p = write(dir.path(), "layers.gguf", &w.to_bytes());
    expect_refused(&p, "num_layers 2147483648 is beyond any real model's");

    let mut w = tiny_llama(1);
    w.meta("llama.block_count", Meta::U32(40));
    let p = write(dir.path(), "layers40.gguf", &w.to_bytes());
    expect_refused(
        &p,
        "block_count is 40 but the file has no tensors for layer 2",
    );

    let mut w = tiny_llama(1);
    w.meta("llama.context_length", Meta::U64(1 << 31));
    let p = write(dir.path(), "context.gguf", &w.to_bytes());
    expect_refused(
        &p,
        "max_position_embeddings 2147483648 is beyond any real model's",
    );

    for (key, name) in [
        ("llama.embedding_length", "hidden_size"),
        ("llama.feed_forward_length", "intermediate_size"),
        ("llama.attention.head_count", "num_heads"),
    ] {
        let mut w = tiny_llama(1);
        w.meta(key, Meta::U64(1 << 40));
        let p = write(dir.path(), "size.gguf", &w.to_bytes());
        expect_refused(
            &p,
            &format!("{name} 1099511627776 is beyond any real model's"),
        );
    }

    // One byte array spanning most of the file: 32 bytes in memory per byte in the file.
    let mut w = tiny_llama(1);
    w.meta("general.padding", Meta::U8s(vec![7; 40 << 20]));
    let p = write(dir.path(), "bytes.gguf", &w.to_bytes());
    expect_refused(&p, "an array of 41943040 items");

    // An integer key given as a huge array: the error names its size, not its items.
    let mut w = tiny_llama(1);
    w.meta("llama.block_count", Meta::U8s(vec![1; 1 << 20]));
    let p = write(dir.path(), "array-count.gguf", &w.to_bytes());
    let (ok, stderr, _) = generate(&p, "");
    assert!(
        !ok && stderr.contains("an array of 1048576 items"),
        "{stderr}"
    );
    assert!(stderr.len() < 4096, "the error is {} bytes", stderr.len());

    // A declared array length beyond what the rest of the file holds at its item size.
    let mut bytes = tiny_llama(1).to_bytes();
    let at = find(&bytes, b"tokenizer.ggml.token_type") + b"tokenizer.ggml.token_type".len();
    // key, then value type (array) and element type (i32), then the length.
    bytes[at + 8..at + 16].copy_from_slice(&(u64::MAX / 4).to_le_bytes());
    let p = write(dir.path(), "array-len.gguf", &bytes);
    expect_refused(&p, "exceeds the rest of the file");
}

#[test]
fn a_template_that_never_ends_is_refused_and_the_model_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama(1);
    let endless =
        "{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}";
    w.meta("tokenizer.chat_template", Meta::Str(endless.into()));
    let p = write(dir.path(), "template.gguf", &w.to_bytes());
    // Completions work: the template is dropped at load, within its fuel.
    let (ok, stderr, took) = generate(&p, "");
    assert!(ok, "{stderr}");
    assert!(stderr.contains("chat template is refused"), "{stderr}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    // Chat asks for it and gets the reason.
    let (ok, stderr, _) = generate(&p, "--chat");
    assert!(!ok && stderr.contains("no chat template"), "{stderr}");
    // One given on the command line is refused outright.
    let (ok, stderr, _) = generate(&p, &format!("--chat --chat-template \"{endless}\""));
    assert!(!ok && stderr.contains("within its budget"), "{stderr}");
    // A template too large to be real.
    let mut w = tiny_llama(1);
    w.meta("tokenizer.chat_template", Meta::Str("x".repeat(1 << 20)));
    let p = write(dir.path(), "big-template.gguf", &w.to_bytes());
    let (ok, stderr, _) = generate(&p, "");
    assert!(ok && stderr.contains("more than the"), "{stderr}");
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).unwrap()
}
