//! infer's engine core: model loading (GGUF, safetensors, hub), tokenizer and chat templates,
//! the op-level `Backend` trait, the Llama forward written once against it, paged KV cache
//! metadata, sampling and generation. It knows nothing of HTTP or GPUs.

pub mod backend;
pub mod batch;
pub mod config;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod hf;
pub mod hub;
pub mod kv_cache;
pub mod loader;
pub mod model;
pub mod sampler;
pub mod tokenizer;
pub mod weights;

pub use backend::{AttentionParams, Backend, DeviceTensor, KvCacheSpec};
pub use batch::{BatchInput, SequenceChunk};
pub use config::{ModelConfig, RopeScaling, RopeStyle};
pub use error::{InferError, Result};
pub use generate::{FinishReason, GenerationOutput, GenerationParams, Generator};
pub use loader::{open_model, ModelFiles};
pub use model::LlamaModel;
pub use tokenizer::{ChatMessage, Tokenizer};
pub use weights::{HostTensor, PackedTensor, WeightSource};
