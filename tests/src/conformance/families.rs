//! Every family's tiny random checkpoint (`scripts/family_models.py`: built by transformers,
//! converted by llama.cpp's converter) against transformers' float64 reference, on any
//! backend, from the HF directory and from the GGUF: teacher-forced log-probabilities over the
//! whole vocabulary, and greedy tokens through the engine alone and batched under preemption.

use std::path::PathBuf;
use std::sync::Arc;

use infer_core::scheduler::{PreemptionMode, SchedulerConfig};
use infer_core::{
    open_model, Backend, BatchInput, EngineOptions, EngineStats, Model, ModelFiles, Prompt,
    SamplingParams, SequenceChunk,
};
use serde::Deserialize;

use crate::fixtures_dir;

#[derive(Debug, Clone, Deserialize)]
pub struct FamilyCase {
    pub name: String,
    pub hf_dir: String,
    pub gguf: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    /// Best-minus-second logit at each greedy step: a flip is a tie only below the tolerance.
    pub greedy_margins: Vec<f32>,
    /// log-softmax rows at positions prompt−1 … end−1 of prompt + greedy tokens.
    pub logprobs: Vec<Vec<f64>>,
}

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<FamilyCase>,
}

/// The two files each case ships as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyFormat {
    Hf,
    Gguf,
}

pub fn families_dir() -> PathBuf {
    fixtures_dir().join("families")
}

pub fn family_cases() -> Vec<FamilyCase> {
    let text = std::fs::read_to_string(families_dir().join("reference.json"))
        .expect("fixtures/families/reference.json (scripts/family_models.py writes it)");
    serde_json::from_str::<Fixture>(&text).unwrap().cases
}

impl FamilyCase {
    pub fn path(&self, format: FamilyFormat) -> PathBuf {
        families_dir().join(match format {
            FamilyFormat::Hf => &self.hf_dir,
            FamilyFormat::Gguf => &self.gguf,
        })
    }

    pub fn open(&self, format: FamilyFormat) -> ModelFiles {
        let path = self.path(format);
        open_model(path.to_str().unwrap())
            .unwrap_or_else(|e| panic!("{} {format:?}: opening: {e}", self.name))
    }
}

/// Loads `files` on `backend` (context `max_model_len` where given).
pub fn load_family<B: Backend>(backend: &B, files: &ModelFiles, what: &str) -> Model<B> {
    Model::load(
        backend,
        &files.config,
        files.weights.as_ref(),
        None,
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("{what}: loading: {e}"))
}

/// Max |log p − reference| over the whole vocabulary at each position after the prompt,
/// running prompt + reference tokens teacher-forced in two chunks over 4-token blocks (the
/// second reads the first's keys from the paged cache).
pub fn max_logprob_diff<B: Backend>(backend: &B, model: &Model<B>, case: &FamilyCase) -> f64 {
    let ids: Vec<u32> = case
        .prompt_ids
        .iter()
        .chain(&case.greedy_ids)
        .copied()
        .collect();
    let bs = 4;
    let blocks = ids.len().div_ceil(bs);
    let mut kv = backend
        .alloc_kv_cache(&model.kv_cache_spec(blocks, bs))
        .unwrap();
    // Blocks in reverse order, so the table matters.
    let table: Vec<u32> = (0..blocks as u32).rev().collect();
    let split = 23;
    let first = SequenceChunk {
        tokens: &ids[..split],
        num_computed: 0,
        block_table: &table,
        want_logits: false,
        all_logits: false,
    };
    let batch = BatchInput::build(&[first], bs).unwrap();
    model.forward_hidden(backend, &batch, &mut kv).unwrap();
    let second = SequenceChunk {
        tokens: &ids[split..],
        num_computed: split,
        block_table: &table,
        want_logits: true,
        all_logits: true,
    };
    let batch = BatchInput::build(&[second], bs).unwrap();
    let logits = model.forward(backend, &batch, &mut kv).unwrap();
    let rows = backend.to_host(&logits).unwrap().data;
    let vocab = model.config().vocab_size;
    let n = case.logprobs.len();
    let rows: Vec<&[f32]> = rows.chunks_exact(vocab).collect();
    let ours = &rows[rows.len() - n..];
    let mut worst = 0f64;
    for (row, want) in ours.iter().zip(&case.logprobs) {
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        let lse = max
            + row
                .iter()
                .map(|&x| (x as f64 - max).exp())
                .sum::<f64>()
                .ln();
        for (&x, &w) in row.iter().zip(want) {
            worst = worst.max((x as f64 - lse - w).abs());
        }
    }
    worst
}

/// Greedy tokens of each prompt through the engine the builder makes: `blocks` of 4 tokens,
/// at most 6 sequences and 16 tokens a step (prefills go in chunks).
pub fn engine_greedy<B: Backend + Clone + 'static>(
    backend: B,
    model: Arc<Model<B>>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    blocks: usize,
    mode: PreemptionMode,
) -> (Vec<Vec<u32>>, EngineStats) {
    let mut engine = tiny_engine_options(blocks, 16, 6, mode)
        .build(backend, model, None, false, None, None)
        .unwrap();
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    };
    let prompts = prompts.iter().map(|p| Prompt::Tokens(p.clone())).collect();
    let out = engine
        .generate(prompts, &[params], &mut |_| {})
        .unwrap()
        .into_iter()
        .map(|r| r.first().token_ids.clone())
        .collect();
    engine.scheduler().check_invariants().unwrap();
    (out, engine.stats())
}

/// Engine options for the tiny models: `blocks` KV blocks of 4 tokens, `budget` tokens and
/// `seqs` sequences a step, prefix caching on, room to swap every request out.
pub fn tiny_engine_options(
    blocks: usize,
    budget: usize,
    seqs: usize,
    mode: PreemptionMode,
) -> EngineOptions {
    EngineOptions {
        block_size: 4,
        num_kv_blocks: Some(blocks),
        kv_cache_bytes: 0,
        kv_cache_bytes_exact: false,
        gpu_memory_utilization: 0.9,
        swap_bytes: 1 << 22,
        scheduler: SchedulerConfig {
            max_num_seqs: seqs,
            max_num_batched_tokens: budget,
            preemption_mode: mode,
        },
        prefix_caching: true,
    }
}

/// `got` equals the reference greedy tokens up to a first difference where the reference's
/// top two logits were within `tie`.
pub fn assert_greedy(what: &str, got: &[u32], case: &FamilyCase, tie: f32) {
    assert_eq!(got.len(), case.greedy_ids.len(), "{what}: token count");
    if let Some(i) = got.iter().zip(&case.greedy_ids).position(|(a, b)| a != b) {
        assert!(
            case.greedy_margins[i] < tie,
            "{what}: token {i} is {} but transformers picked {} (margin {}): got {got:?}, want {:?}",
            got[i],
            case.greedy_ids[i],
            case.greedy_margins[i],
            case.greedy_ids
        );
    }
}

/// Prompts for the batched run: the case's own, and five others cut from it and shifted, so
/// requests of different lengths crowd a small pool.
pub fn crowd(case: &FamilyCase) -> Vec<Vec<u32>> {
    let mut prompts = vec![case.prompt_ids.clone()];
    for k in 1..6 {
        let mut p: Vec<u32> = case.prompt_ids[k * 3..].to_vec();
        p.rotate_left(k);
        prompts.push(p);
    }
    prompts
}

/// The whole check for one case and format on `make()`'s backend: log-probabilities within
/// `tol`, greedy tokens alone, and batched with preemption equal to each prompt alone.
/// Returns the max log-probability difference.
pub fn check_family<B: Backend + Clone + 'static>(
    make: impl Fn() -> B,
    case: &FamilyCase,
    format: FamilyFormat,
    tol: f64,
) -> f64 {
    let what = format!("{} {format:?}", case.name);
    let files = case.open(format);
    // llama.cpp's converter writes Mistral as `llama` (its window then comes from metadata)
    // and OLMo 3 as `olmo2` (with window keys).
    let family = match (case.name.as_str(), format) {
        ("llama3", _) | ("mistral", FamilyFormat::Gguf) => "llama",
        ("olmo3", FamilyFormat::Gguf) => "olmo2",
        (name, _) => name,
    };
    assert_eq!(files.config.architecture, family, "{what}: family");
    let backend = make();
    let model = Arc::new(load_family(&backend, &files, &what));
    let diff = max_logprob_diff(&backend, &model, case);
    assert!(diff <= tol, "{what}: max |logprob diff| {diff} > {tol}");
    let tie = 2.0 * tol as f32;
    let n = case.greedy_ids.len();
    let alone = |p: &[Vec<u32>]| {
        p.iter()
            .map(|p| {
                let one = std::slice::from_ref(p);
                engine_greedy(make(), model.clone(), one, n, 64, PreemptionMode::Recompute)
                    .0
                    .remove(0)
            })
            .collect::<Vec<_>>()
    };
    let prompts = crowd(case);
    let want = alone(&prompts);
    assert_greedy(&format!("{what} alone"), &want[0], case, tie);
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        // 13 blocks of 4 hold the longest request (48 tokens) and a little more; six requests
        // need about 250 tokens at once.
        let (got, stats) = engine_greedy(make(), model.clone(), &prompts, n, 13, mode);
        assert!(
            stats.preemptions > 0,
            "{what} {mode:?}: the pool should force preemption"
        );
        assert_eq!(got, want, "{what} {mode:?}: batched differs from alone");
        // Where every layer slides (Mistral), blocks the window has left go back to the pool.
        assert_eq!(
            stats.window_released_blocks > 0,
            files.config.all_layers_slide(),
            "{what} {mode:?}: {} blocks released",
            stats.window_released_blocks
        );
    }
    diff
}
