//! Shared helpers for the cross-crate tests: where the real model and fixtures live, a small
//! GGUF writer for models the tests make themselves, and an HF-directory writer.

pub mod gguf_writer;
pub mod hf_writer;

use std::path::PathBuf;

use infer_core::{open_model, BatchInput, Generator, LlamaModel, ModelFiles, SequenceChunk};
use infer_cpu::CpuBackend;

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The SmolLM2 GGUF: `$INFER_TEST_MODEL` or `models/SmolLM2-135M-Instruct.Q4_1.gguf`.
/// Tests fail (never skip) without it: `scripts/fetch-model.sh` downloads it.
pub fn smollm2_path() -> String {
    let path = std::env::var("INFER_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-model.sh (or set INFER_TEST_MODEL)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

pub fn fixtures_dir() -> PathBuf {
    workspace_root().join("fixtures")
}

pub struct Loaded {
    pub files: ModelFiles,
    pub model: LlamaModel<CpuBackend>,
}

pub fn load_cpu(spec: &str) -> Loaded {
    let files = open_model(spec).unwrap_or_else(|e| panic!("opening {spec}: {e}"));
    let model = LlamaModel::load(
        &CpuBackend,
        &files.config,
        files.weights.as_ref(),
        None,
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("loading {spec}: {e}"));
    Loaded { files, model }
}

impl Loaded {
    /// Logits at the last position of `ids`, run as one prefill.
    pub fn last_logits(&self, ids: &[u32]) -> Vec<f32> {
        let bs = 16;
        let blocks = ids.len().div_ceil(bs);
        let mut kv =
            infer_core::Backend::alloc_kv_cache(&CpuBackend, &self.model.kv_cache_spec(blocks, bs))
                .unwrap();
        let table: Vec<u32> = (0..blocks as u32).collect();
        let batch = BatchInput::build(
            &[SequenceChunk {
                tokens: ids,
                num_computed: 0,
                block_table: &table,
                want_logits: true,
            }],
            bs,
        )
        .unwrap();
        let logits = self.model.forward(&CpuBackend, &batch, &mut kv).unwrap();
        logits.data().to_vec()
    }

    pub fn generator(&self) -> Generator<'_, CpuBackend> {
        Generator::new(&CpuBackend, &self.model, &self.files.tokenizer)
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
