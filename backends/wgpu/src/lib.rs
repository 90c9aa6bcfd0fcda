//! wgpu backend: the WGSL kernels of `shaders/` run through wgpu on Vulkan, Metal, DX12 and
//! WebGPU. `GpuContext` owns the adapter, device, queue, pipelines, the buffer pool and the
//! step recorder; `WgpuBackend` implements the core's `Backend` trait on it.

mod backend;
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
mod buffers;
mod cache;
mod context;
mod kernels;
mod pool;
mod recorder;
mod tensor;

pub use backend::{WgpuBackend, WgpuBatch};
pub use buffers::WG;
pub use cache::{WgpuKvCache, WgpuSwapSpace};
pub use context::{GpuContext, GpuError, GpuResult};
pub use kernels::{AttentionShape, MatrixRef, WeightStorage};
pub use pool::GpuBuffer;
pub use tensor::WgpuTensor;
