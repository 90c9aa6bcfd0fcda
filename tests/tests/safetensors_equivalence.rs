//! The same model loaded from GGUF and from an HF safetensors directory gives the same logits:
//! this checks the safetensors loader, the HF config parser and both RoPE layouts.

use infer_core::{open_model, RopeStyle};
use infer_tests::gguf_writer::tiny_llama;
use infer_tests::hf_writer::{write_hf_dir, SaveDtype};
use infer_tests::{load_cpu, load_cpu_with, max_abs_diff, smollm2_path, Loaded};

/// A GGUF file on the CPU's exact kernels (packed as stored, f32 activations), which compute
/// on the same weights as an f32 safetensors copy: the loaders are under test here, not the
/// activations' quantization on matrices repacked for the integer kernels.
fn load_exact(path: &str) -> Loaded {
    load_cpu_with(path, infer_cpu::CpuBackend::new().without_repacking())
}

#[test]
fn smollm2_gguf_and_safetensors_give_the_same_logits() {
    let gguf = load_exact(&smollm2_path());
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir(&gguf, dir.path(), SaveDtype::F32);
    let hf = load_cpu(dir.path().to_str().unwrap());
    assert_eq!(gguf.config.rope_style, RopeStyle::AdjacentPairs);
    assert_eq!(hf.config.rope_style, RopeStyle::HalfSplit);
    assert_eq!(hf.tokenizer.eos_token_ids(), gguf.tokenizer.eos_token_ids());

    let text = "The Eiffel Tower is located in the city of";
    let ids = gguf.tokenizer.encode(text, true).unwrap();
    assert_eq!(hf.tokenizer.encode(text, true).unwrap(), ids);
    let (a, b) = (gguf.last_logits(&ids), hf.last_logits(&ids));
    let diff = max_abs_diff(&a, &b);
    // Identical weights; only float summation order differs (the rotated pairs are permuted).
    assert!(diff < 1e-3, "max |logit diff| {diff}");
}

#[test]
fn tiny_model_in_f16_and_bf16_matches_f32_within_rounding() {
    let dir = tempfile::tempdir().unwrap();
    let gguf_path = dir.path().join("tiny.gguf");
    std::fs::write(&gguf_path, tiny_llama(7).to_bytes()).unwrap();
    let reference = load_exact(gguf_path.to_str().unwrap());
    let ids = [2u32, 50, 100, 7, 9, 200, 11];
    let want = reference.last_logits(&ids);
    for (dtype, tol) in [
        (SaveDtype::F32, 1e-4),
        (SaveDtype::F16, 5e-2),
        (SaveDtype::BF16, 2e-1),
    ] {
        let hf_dir = tempfile::tempdir().unwrap();
        write_hf_dir(&reference, hf_dir.path(), dtype);
        let got = load_cpu(hf_dir.path().to_str().unwrap()).last_logits(&ids);
        let diff = max_abs_diff(&want, &got);
        assert!(diff < tol, "max |logit diff| {diff} >= {tol}");
    }
}

#[test]
fn sharded_safetensors_load_through_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let gguf_path = dir.path().join("tiny.gguf");
    std::fs::write(&gguf_path, tiny_llama(3).to_bytes()).unwrap();
    let reference = load_exact(gguf_path.to_str().unwrap());
    let hf_dir = tempfile::tempdir().unwrap();
    write_hf_dir(&reference, hf_dir.path(), SaveDtype::F32);

    // Split model.safetensors into two shards by tensor name and write the index.
    let whole = std::fs::read(hf_dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&whole).unwrap();
    let mut shards: [Vec<(String, safetensors::tensor::TensorView)>; 2] = [Vec::new(), Vec::new()];
    let mut weight_map = serde_json::Map::new();
    for (name, view) in st.tensors() {
        let k = usize::from(name.contains("layers.1."));
        let file = format!("model-0000{}-of-00002.safetensors", k + 1);
        weight_map.insert(name.clone(), file.into());
        shards[k].push((name, view));
    }
    for (k, shard) in shards.into_iter().enumerate() {
        let path = hf_dir
            .path()
            .join(format!("model-0000{}-of-00002.safetensors", k + 1));
        safetensors::serialize_to_file(shard, None, &path).unwrap();
    }
    std::fs::remove_file(hf_dir.path().join("model.safetensors")).unwrap();
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(
        hf_dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();

    let ids = [5u32, 6, 7, 8];
    let got = load_cpu(hf_dir.path().to_str().unwrap()).last_logits(&ids);
    assert!(max_abs_diff(&reference.last_logits(&ids), &got) < 1e-4);
    assert!(open_model(hf_dir.path().to_str().unwrap()).is_ok());
}
