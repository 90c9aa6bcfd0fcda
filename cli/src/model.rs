//! Choosing a backend, the thread pool, and loading a model with a progress bar.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use infer_core::gguf::GgmlType;
use infer_core::parallel::run_worker;
use infer_core::{
    open_request, Backend, Engine, Executor, LoadRequest, Model, OpenedModel, TensorParallel,
    Tokenizer, WeightsFrom,
};
use infer_cpu::CpuBackend;
use infer_cuda::CudaBackend;
use infer_wgpu::{WeightStorage, WgpuBackend};

use crate::engine_args::EngineArgs;
use crate::parallel::{self, ParallelArgs};
use infer_core::spec_decode::{SpecMethod, SpeculativeConfig};
use infer_core::Speculation;

pub use crate::backend_kind::BackendKind;

/// How the CPU backend holds quantized weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CpuWeights {
    /// Packed, decoded inside the matmul (fast); Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K
    /// matrices repacked at load into interleaved groups of rows where this CPU has their
    /// kernels (x86 with AVX2; llama.cpp's repack), which replace the file's pages in memory.
    Packed,
    /// Packed as stored, computed on in place in the mapped file (no repacking: faster load,
    /// pages shared between processes; slower matmuls).
    Mapped,
    /// Dequantized to f32 at load (the plain reference path).
    F32,
}

/// How the wgpu backend stores weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WgpuWeights {
    /// Half the memory and bandwidth of f32 (packed pairs: no SHADER_F16 needed).
    F16,
    /// Exact dequantized values (the CPU reference path bit for bit in the weights).
    F32,
}

/// How the CUDA backend stores weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CudaWeights {
    /// Quantized GGUF matrices (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) stay in their blocks on
    /// the GPU, computed on in-kernel; other matrices f16.
    Packed,
    /// Every matrix dequantized to f16, on tensor cores with f32 accumulation (cuBLAS).
    F16,
    /// Exact dequantized values, f32 GEMMs (the reference path).
    F32,
}

impl WgpuWeights {
    fn storage(self) -> WeightStorage {
        match self {
            WgpuWeights::F16 => WeightStorage::F16,
            WgpuWeights::F32 => WeightStorage::F32,
        }
    }
}

impl CpuWeights {
    pub fn backend(self) -> CpuBackend {
        match self {
            CpuWeights::Packed => CpuBackend::new(),
            CpuWeights::Mapped => CpuBackend::new().without_repacking(),
            CpuWeights::F32 => CpuBackend::f32_weights(),
        }
    }
}

/// Builds rayon's global pool (default: one thread per core). The calling thread is one of the
/// workers, so the forward's parallel ops start without a hand-off to another thread.
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    build_pool(threads, true)
}

/// Builds rayon's global pool once per process (and checks the CPU kernel level `INFER_CPU_ISA`
/// names); `caller_works`: the calling thread is one of
/// its workers (a thread that lives as long as the process: not an engine thread that a
/// library's user may stop).
pub fn build_pool(threads: Option<usize>, caller_works: bool) -> Result<()> {
    if threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // A process that loads a second model (Python's `LLM` twice) keeps the pool it has.
    static BUILT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if let Some(&built) = BUILT.get() {
        if threads.is_some_and(|t| t != built) {
            bail!("--threads {n}: this process already runs its models on {built} threads");
        }
        return Ok(());
    }
    // A level `INFER_CPU_ISA` names that this CPU lacks (or no level at all) is refused here,
    // before the kernels fall back to the best level.
    let isa = infer_cpu::Isa::from_env().map_err(anyhow::Error::msg)?;
    tracing::info!(threads = n, kernels = %isa, "CPU");
    let mut pool = rayon::ThreadPoolBuilder::new().num_threads(n);
    if caller_works {
        pool = pool.use_current_thread();
    }
    pool.build_global().context("configuring the thread pool")?;
    let _ = BUILT.set(n);
    Ok(())
}

fn load_progress() -> ProgressBar {
    ProgressBar::new(0).with_style(
        ProgressStyle::with_template("loading weights {bar:30} {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

/// The type of dummy weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DummyDtype {
    F32,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q4_k")]
    Q4K,
    #[value(name = "q5_k")]
    Q5K,
    #[value(name = "q6_k")]
    Q6K,
}

/// Where the weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoadFormat {
    /// The model's own weights (GGUF or safetensors).
    Auto,
    /// Random weights in the model's shapes (config.json, an HF dir or a GGUF): for
    /// benchmarking shapes we have no weights for.
    Dummy,
}

/// Opens a model and uploads its weights to `backend`, with a progress bar; the weight files
/// are released once uploaded. `tokenizer`, when given, names where the tokenizer comes from.
pub fn load_model<B: Backend>(
    backend: &B,
    args: &ModelArgs,
    tp: TensorParallel,
) -> Result<(Model<B>, Tokenizer)> {
    if args.load_format != LoadFormat::Dummy && args.dummy_dtype != DummyDtype::F32 {
        bail!("--dummy-dtype applies only with --load-format dummy");
    }
    let weights = match args.load_format {
        LoadFormat::Auto => WeightsFrom::File,
        LoadFormat::Dummy => WeightsFrom::Dummy {
            packed: match args.dummy_dtype {
                DummyDtype::F32 => None,
                DummyDtype::Q4_0 => Some(GgmlType::Q4_0),
                DummyDtype::Q8_0 => Some(GgmlType::Q8_0),
                DummyDtype::Q4_1 => Some(GgmlType::Q4_1),
                DummyDtype::Q4K => Some(GgmlType::Q4K),
                DummyDtype::Q5K => Some(GgmlType::Q5K),
                DummyDtype::Q6K => Some(GgmlType::Q6K),
            },
        },
    };
    let OpenedModel {
        config,
        weights,
        tokenizer,
    } = open_request(&LoadRequest {
        model: &args.model,
        weights,
        tokenizer: args.tokenizer.as_deref(),
        chat_template: args.chat_template.as_deref(),
    })?;
    tracing::info!(backend = backend.name(), "loading weights");
    // Only rank 0 draws the bar (every rank of a group writes to the same terminal).
    let bar = if tp.rank == 0 {
        load_progress()
    } else {
        ProgressBar::hidden()
    };
    let model = Model::load_sharded(
        backend,
        &config,
        weights.as_ref(),
        args.max_model_len,
        tp,
        &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    )?;
    bar.finish_and_clear();
    Ok((model, tokenizer))
}

/// The model, backend and engine flags of every command that runs a model.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// GGUF file, HF model directory, or Hugging Face hub id (org/name); with
    /// `--load-format dummy` also a config.json.
    #[arg(long)]
    pub model: String,
    #[arg(long, value_enum, default_value = "auto")]
    pub load_format: LoadFormat,
    /// With `--load-format dummy`: the type of the random matrices (quantized types fit
    /// real-size models in a small machine's memory).
    #[arg(long, value_enum, default_value = "f32")]
    pub dummy_dtype: DummyDtype,
    /// Take the tokenizer from this model instead (GGUF, HF dir or hub id).
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// A Jinja chat template to use instead of the model's: a file, or the template itself.
    #[arg(long)]
    pub chat_template: Option<String>,
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendKind,
    #[arg(long, value_enum, default_value = "packed")]
    pub cpu_weights: CpuWeights,
    #[arg(long, value_enum, default_value = "f16")]
    pub wgpu_weights: WgpuWeights,
    #[arg(long, value_enum, default_value = "packed")]
    pub cuda_weights: CudaWeights,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub cuda_device: usize,
    /// CUDA: run every step op by op instead of replaying decode steps recorded as CUDA
    /// graphs (as vLLM's flag).
    #[arg(long)]
    pub enforce_eager: bool,
    /// CUDA: the largest decode batch recorded as a CUDA graph; larger ones run eagerly.
    #[arg(long, default_value_t = infer_cuda::DEFAULT_MAX_CAPTURE)]
    pub max_cudagraph_capture_size: usize,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Cap the context length (default: the model's, lowered if the KV pool is smaller);
    /// `4k` = 4000 and `4K` = 4096, as vLLM reads them.
    #[arg(long, value_parser = crate::vllm::human_int)]
    pub max_model_len: Option<usize>,
    /// The type activations and GPU weights are computed in (vLLM's --dtype): `auto` (the
    /// backend's: f32 on CPU, f16 weights on GPUs), `float32`/`float` (f32 GPU weights, as
    /// --wgpu-weights / --cuda-weights f32), `float16`/`half` (GPUs only). `bfloat16` is not
    /// supported.
    #[arg(long, default_value = "auto", value_parser = ["auto", "half", "float16", "float", "float32", "bfloat16"])]
    pub dtype: String,
    /// Most top logprobs a request may ask for per token (vLLM's --max-logprobs).
    #[arg(long, default_value_t = infer_core::sampling::MAX_LOGPROBS)]
    pub max_logprobs: usize,
    /// Speculative decoding, as vLLM spells it: '{"method": "ngram", "num_speculative_tokens":
    /// 4, "prompt_lookup_max": 4}' or '{"model": DRAFT, "num_speculative_tokens": 4}' (a
    /// draft with the target's tokenizer); "disable_by_batch_size": N turns it off for steps
    /// with N or more running sequences.
    #[arg(long)]
    pub speculative_config: Option<String>,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub parallel: ParallelArgs,
}

/// What this process does in its tensor-parallel group.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Rank 0 (or the only process): schedules and samples.
    Leader,
    /// Runs the steps rank 0 sends.
    Worker,
}

/// An engine over whichever backend was chosen.
pub type AnyEngine = Engine<Box<dyn Executor>>;

impl ModelArgs {
    /// Loads the model and builds the engine on the chosen backend (rank 0 of a
    /// tensor-parallel group: the engine drives the other ranks).
    pub fn engine(&self) -> Result<(AnyEngine, Arc<Tokenizer>, String)> {
        self.on_backend(Role::Leader)?
            .context("rank 0 built no engine")
    }

    /// A tensor-parallel worker rank: loads its slice of the model and runs the steps rank 0
    /// sends until rank 0 is done.
    pub fn run_worker(&self) -> Result<()> {
        self.on_backend(Role::Worker).map(drop)
    }

    /// `--speculative-config`, checked before anything loads.
    pub fn speculative_config(&self) -> Result<Option<SpeculativeConfig>> {
        self.speculative_config
            .as_deref()
            .map(SpeculativeConfig::from_json)
            .transpose()
            .context("--speculative-config")
    }

    /// Loads the draft model `--speculative-config` names, on the target's backend, and
    /// checks that it speaks the target's vocabulary.
    fn speculation<B: Backend>(
        &self,
        backend: &B,
        target: &Model<B>,
        tokenizer: &Tokenizer,
        tensor_parallel: bool,
    ) -> Result<Option<Speculation<B>>> {
        let Some(config) = self.speculative_config()? else {
            return Ok(None);
        };
        let SpecMethod::Draft { model } = config.method()? else {
            return Ok(Some(Speculation {
                config,
                draft: None,
            }));
        };
        if tensor_parallel {
            bail!(
                "--speculative-config: a draft model does not run with tensor parallelism; \
                 use {{\"method\": \"ngram\"}}"
            );
        }
        let args = ModelArgs {
            model: model.clone(),
            tokenizer: None,
            chat_template: None,
            speculative_config: None,
            ..self.clone()
        };
        let (draft, draft_tokenizer) = load_model(backend, &args, TensorParallel::single())
            .with_context(|| format!("loading the draft model {model}"))?;
        let (dv, tv) = (draft.config().vocab_size, target.config().vocab_size);
        if dv != tv || draft_tokenizer.vocab_size() != tokenizer.vocab_size() {
            bail!(
                "the draft model {model} has a vocabulary of {dv} ({} in its tokenizer), the \
                 target {tv} ({}): a draft must share the target's tokenizer",
                draft_tokenizer.vocab_size(),
                tokenizer.vocab_size()
            );
        }
        Ok(Some(Speculation {
            config,
            draft: Some(Arc::new(draft)),
        }))
    }

    /// `--dtype` on the chosen backend: the weight storage it picks (`None`: the backend's
    /// own flags), or why it cannot be honoured.
    fn dtype_weights_f32(&self) -> Result<Option<bool>> {
        let dtype = self.dtype.as_str();
        match (dtype, self.backend) {
            ("auto", _) => Ok(None),
            ("bfloat16", _) => {
                bail!("--dtype bfloat16 is not supported: use float16 (GPUs) or float32")
            }
            ("float" | "float32", _) => Ok(Some(true)),
            ("half" | "float16", BackendKind::Cpu) => bail!(
                "--dtype {dtype}: the CPU backend computes in float32 (use --dtype auto or float32)"
            ),
            (_, _) => Ok(Some(false)),
        }
    }

    fn on_backend(&self, role: Role) -> Result<Option<(AnyEngine, Arc<Tokenizer>, String)>> {
        self.speculative_config()?;
        let f32_weights = self.dtype_weights_f32()?;
        init_threads(self.threads)?;
        let group = parallel::group();
        match self.backend {
            BackendKind::Cpu => {
                let mut backend = self.cpu_weights.backend();
                if let Some(g) = &group {
                    backend = backend.with_group(g.clone());
                }
                self.engine_on(backend, role)
            }
            BackendKind::Wgpu => {
                let storage = match f32_weights {
                    Some(true) => WeightStorage::F32,
                    Some(false) => WeightStorage::F16,
                    None => self.wgpu_weights.storage(),
                };
                let backend = WgpuBackend::new(storage)?;
                tracing::info!(adapter = %backend.context().adapter_name(), "wgpu");
                self.engine_on(backend, role)
            }
            BackendKind::Cuda => {
                let weights = match (f32_weights, self.cuda_weights) {
                    (Some(true), _) | (None, CudaWeights::F32) => infer_cuda::CudaWeights::F32,
                    // Half precision (vLLM's --dtype half) computes on the blocks of a
                    // quantized model as vLLM's GGUF kernels do.
                    (_, CudaWeights::Packed) => infer_cuda::CudaWeights::Packed,
                    (Some(false), _) | (None, CudaWeights::F16) => infer_cuda::CudaWeights::F16,
                };
                // Each rank of a node takes the next device.
                let device = self.cuda_device
                    + group
                        .as_ref()
                        .map_or(0, |_| parallel::local_rank().unwrap_or(0));
                let graphs = if self.enforce_eager {
                    0
                } else {
                    self.max_cudagraph_capture_size
                };
                let mut backend = CudaBackend::new(device, weights)?.with_cuda_graphs(graphs);
                if let Some(g) = &group {
                    backend = backend.with_group(g.as_ref())?;
                }
                self.engine_on(backend, role)
            }
        }
    }

    fn engine_on<B: Backend + Clone + 'static>(
        &self,
        backend: B,
        role: Role,
    ) -> Result<Option<(AnyEngine, Arc<Tokenizer>, String)>> {
        let group = parallel::group();
        let tp = group
            .as_ref()
            .map_or(TensorParallel::single(), TensorParallel::of);
        let name = match &group {
            Some(g) => format!("{} × {} ranks ({})", backend.name(), g.size(), g.describe()),
            None => backend.name(),
        };
        let (model, tokenizer) = load_model(&backend, self, tp)?;
        let tokenizer = Arc::new(tokenizer);
        let explicit = self.max_model_len.is_some();
        let model = Arc::new(model);
        match (role, group) {
            (Role::Worker, Some(group)) => {
                let mut executor = self
                    .engine
                    .options()?
                    .executor(backend, model, explicit, Some(group.as_ref()), 0)?
                    .0
                    .headless();
                run_worker(&mut executor, group.as_ref())?;
                Ok(None)
            }
            (Role::Worker, None) => bail!("a worker rank needs a tensor-parallel group"),
            (Role::Leader, group) => {
                let speculation =
                    self.speculation(&backend, &model, &tokenizer, group.is_some())?;
                let mut engine = self.engine.options()?.build(
                    backend,
                    model,
                    Some(tokenizer.clone()),
                    explicit,
                    group,
                    speculation,
                )?;
                engine.set_max_logprobs(self.max_logprobs);
                engine.set_priority_scheduling(self.engine.scheduling_policy == "priority");
                Ok(Some((engine, tokenizer, name)))
            }
        }
    }
}
