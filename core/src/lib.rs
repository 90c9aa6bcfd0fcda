//! infer's engine core: model loading (GGUF, safetensors, hub), tokenizer and chat templates,
//! the op-level `Backend` trait, the decoder forward of every supported family written once against it, the block manager
//! (paged KV cache with copy-on-write and prefix caching), the continuous-batching scheduler,
//! the engine (`add_request` / `abort_request` / `step`), and sampling. It knows nothing of
//! HTTP or GPUs.

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]

pub mod backend;
pub mod batch;
pub mod block_manager;
pub mod config;
#[cfg(feature = "native")]
pub mod dummy;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod host_tensor;
#[cfg(feature = "native")]
pub mod hub;
#[cfg(feature = "native")]
pub mod loader;
pub mod model;
pub mod moe;
pub mod narrow;
pub mod parallel;
pub mod pooling;
pub mod rope;
pub mod sampling;
pub mod scheduler;
#[cfg(feature = "native")]
pub mod serving;
pub mod spec_decode;
pub mod tokenizer;
pub mod weights;

pub use backend::{
    AttentionParams, Backend, DeviceMemory, DeviceTensor, KvCacheSpec, PendingLogits,
};
pub use batch::{BatchInput, SequenceChunk};
pub use config::{Activation, Features, ModelConfig, NormPlacement, QkNorm};
pub use engine::{
    CompletedRequest, CompletionOutput, Engine, EngineConfig, EngineOptions, EngineStats, Executor,
    FinishReason, ModelExecutor, Prompt, RequestMetrics, RequestOutput, SequenceDelta, Speculation,
    StepLogits, StopReason, TokenLogprobs, TopLogprob,
};
pub use error::{BackendError, InferError, Result};
/// A compiled structured-output constraint (llguidance's matcher) for `add_request_compiled`.
pub use llguidance::Matcher as GrammarMatcher;
#[cfg(feature = "native")]
pub use loader::{open_model, open_request, LoadRequest, ModelFiles, OpenedModel, WeightsFrom};
pub use model::{Family, Model};
pub use parallel::{ProcessGroup, TensorParallel, TpExecutor};
pub use pooling::{EmbedParams, PoolingType};
pub use rope::{Rope, RopeScaling, RopeStyle};
pub use sampling::{GrammarCompiler, SamplingParams};
pub use scheduler::{PreemptionMode, SchedulerConfig};
pub use tokenizer::{template_takes_tools, ChatMessage, Tokenizer};
pub use weights::{HostTensor, PackedBytes, PackedTensor, WeightSource};
