//! Shared helpers for the cross-crate tests: where the real model and fixtures live, a small
//! GGUF writer for models the tests make themselves, and an HF-directory writer.

// Fixtures and reference checks, built from small shapes and seeds.
#![allow(clippy::cast_possible_truncation)]

pub mod conformance;
pub mod gguf_writer;
pub mod hf_writer;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;

use infer_core::{
    open_model, Backend, BatchInput, CompletionOutput, EngineOptions, Model, ModelConfig,
    PreemptionMode, SamplingParams, SchedulerConfig, SequenceChunk, Tokenizer, WeightSource,
};
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

/// Every way the CPU backend can hold weights (packed with matrices repacked where
/// the CPU has their kernels, packed as stored, f32); reference tests run on each.
pub fn cpu_backends() -> [CpuBackend; 3] {
    [
        CpuBackend::new(),
        CpuBackend::new().without_repacking(),
        CpuBackend::f32_weights(),
    ]
}

pub struct Loaded {
    pub config: ModelConfig,
    pub weights: Box<dyn WeightSource>,
    pub tokenizer: Arc<Tokenizer>,
    pub model: Arc<Model<CpuBackend>>,
    pub backend: CpuBackend,
}

/// Loads on the default CPU backend (block-quantized matrices kept packed).
pub fn load_cpu(spec: &str) -> Loaded {
    load_cpu_with(spec, CpuBackend::new())
}

pub fn load_cpu_with(spec: &str, backend: CpuBackend) -> Loaded {
    let files = open_model(spec).unwrap_or_else(|e| panic!("opening {spec}: {e}"));
    let model = Model::load(
        &backend,
        &files.config,
        files.weights.as_ref(),
        None,
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("loading {spec}: {e}"));
    Loaded {
        config: files.config,
        weights: files.weights,
        tokenizer: Arc::new(files.tokenizer),
        model: Arc::new(model),
        backend,
    }
}

impl Loaded {
    /// Logits at the last position of `ids`, run as one prefill.
    pub fn last_logits(&self, ids: &[u32]) -> Vec<f32> {
        let bs = 16;
        let blocks = ids.len().div_ceil(bs);
        let mut kv = self
            .backend
            .alloc_kv_cache(&self.model.kv_cache_spec(blocks, bs))
            .unwrap();
        let table: Vec<u32> = (0..blocks as u32).collect();
        let chunk = SequenceChunk {
            tokens: ids,
            num_computed: 0,
            block_table: &table,
            want_logits: true,
            all_logits: false,
        };
        let batch = BatchInput::build(&[chunk], bs).unwrap();
        let logits = self.model.forward(&self.backend, &batch, &mut kv).unwrap();
        logits.as_f32().unwrap().to_vec()
    }

    /// Generates one sequence from `prompt` through the serving engine (scheduler, block
    /// manager, sampler, detokenizer, stop checks: the path production runs), in KV blocks of
    /// 16 tokens with prefill chunks of up to 512; `on_text` gets each streamed text delta.
    pub fn generate(
        &self,
        prompt: &[u32],
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
    ) -> CompletionOutput {
        self.generate_in(prompt, params, 16, 512, on_text)
    }

    /// `generate` with `block_size`-token KV blocks and a token budget of `prefill_chunk` a
    /// step (prompts longer than it are prefilled in chunks).
    pub fn generate_in(
        &self,
        prompt: &[u32],
        params: &SamplingParams,
        block_size: usize,
        prefill_chunk: usize,
        on_text: &mut dyn FnMut(&str),
    ) -> CompletionOutput {
        let capacity = prompt.len() + params.max_tokens.unwrap_or(self.model.max_model_len());
        let options = EngineOptions {
            block_size,
            num_kv_blocks: Some(
                capacity
                    .min(self.model.max_model_len())
                    .div_ceil(block_size)
                    + 1,
            ),
            kv_cache_bytes: 0,
            kv_cache_bytes_exact: false,
            gpu_memory_utilization: 0.9,
            swap_bytes: 0,
            scheduler: SchedulerConfig {
                max_num_seqs: 1,
                max_num_batched_tokens: prefill_chunk,
                preemption_mode: PreemptionMode::Recompute,
            },
            prefix_caching: false,
        };
        let mut engine = options
            .build(
                self.backend.clone(),
                self.model.clone(),
                Some(self.tokenizer.clone()),
                false,
                None,
                None,
            )
            .expect("building the engine");
        engine
            .add_request("0", prompt.to_vec(), params.clone())
            .expect("adding the request");
        loop {
            for out in engine.step().expect("engine step") {
                for d in &out.deltas {
                    on_text(&d.text_delta);
                }
                if let Some(mut outputs) = out.outputs {
                    engine.scheduler().check_invariants().unwrap();
                    return outputs.remove(0);
                }
            }
        }
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// SmolLM2 on the packed CPU backend, shareable by engines, with its tokenizer.
pub fn smollm2_shared() -> (Arc<Model<CpuBackend>>, Arc<Tokenizer>) {
    shared_model(&smollm2_path())
}

/// A model on the packed CPU backend, shareable by engines, with its tokenizer.
pub fn shared_model(spec: &str) -> (Arc<Model<CpuBackend>>, Arc<Tokenizer>) {
    let files = open_model(spec).unwrap_or_else(|e| panic!("opening {spec}: {e}"));
    let model = Model::load(
        &CpuBackend::new(),
        &files.config,
        files.weights.as_ref(),
        None,
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("loading {spec}: {e}"));
    (Arc::new(model), Arc::new(files.tokenizer))
}

/// Runs the `infer` binary at `exe` (a CLI test's `env!("CARGO_BIN_EXE_infer")`) offline.
pub fn run_infer(exe: &str, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("running infer")
}

/// The stdout of a run that must have succeeded (its stderr is the failure message).
pub fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts `infer serve` (`exe`, offline) with `args` plus `--port 0`; returns the process and
/// the base URL it says it listens on (stderr's `infer serve: URL` line).
pub fn spawn_serve(exe: &str, args: &[&str]) -> (Child, String) {
    let (child, url, _) = spawn_serve_logged(exe, args);
    (child, url)
}

/// `spawn_serve`, also returning the server's log (stderr) as it grows.
pub fn spawn_serve_logged(
    exe: &str,
    args: &[&str],
) -> (Child, String, std::sync::Arc<std::sync::Mutex<String>>) {
    let mut child = Command::new(exe)
        .arg("serve")
        .args(args)
        .args(["--port", "0"])
        .env("HF_HUB_OFFLINE", "1")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("starting infer serve");
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap_or(0) > 0 {
        log.lock().unwrap().push_str(&line);
        if let Some(rest) = line.trim().strip_prefix("infer serve: ") {
            if let Some(url) = rest.split_whitespace().next() {
                // The rest of the server's log goes to the test's (shown when it fails); an
                // unread pipe would fill, or break, under the server.
                let kept = log.clone();
                std::thread::spawn(move || {
                    let mut line = String::new();
                    while stderr.read_line(&mut line).unwrap_or(0) > 0 {
                        eprint!("[serve] {line}");
                        kept.lock().unwrap().push_str(&line);
                        line.clear();
                    }
                });
                return (child, url.to_string(), log);
            }
        }
        line.clear();
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("no address on stderr; log:\n{}", log.lock().unwrap());
}
