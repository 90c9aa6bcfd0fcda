//! wgpu backend: the WGSL kernels of `shaders/` run through wgpu on Vulkan, Metal, DX12 and
//! WebGPU. `GpuContext` owns the adapter, device, queue and pipelines; `WgpuBackend` implements
//! the core's `Backend` trait with one kernel dispatch per op.

mod backend;
mod buffers;
mod context;
mod kernels;

pub use backend::{WgpuBackend, WgpuBatch, WgpuKvCache, WgpuSwapSpace, WgpuTensor};
pub use buffers::WG;
pub use context::{GpuContext, GpuError, GpuResult};
pub use kernels::AttentionShape;
