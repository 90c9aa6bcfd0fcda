//! wgpu backend: the WGSL kernels of `shaders/` run through wgpu on Vulkan, Metal, DX12 and
//! WebGPU. `GpuContext` owns the adapter, device, queue, pipelines, the buffer pool and the
//! step recorder; `WgpuBackend` implements the core's `Backend` trait on it.

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]
// On wasm32 wgpu's handles are neither Send nor Sync (no threads there: everything runs on the
// worker's one thread), so the `Arc`s shared with native code are single-threaded there.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

mod backend;
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
mod buffers;
mod cache;
mod context;
mod device;
mod kernels;
mod moe;
mod pool;
mod recorder;
mod tensor;

pub use backend::WgpuBatch;
pub use buffers::WG;
pub use cache::{WgpuKvCache, WgpuSwapSpace};
pub use context::{GpuContext, GpuError, GpuResult};
pub use device::WgpuBackend;
pub use kernels::{AttentionShape, MatrixRef, WeightStorage};
pub use moe::WgpuRouting;
pub use pool::GpuBuffer;
pub use tensor::WgpuTensor;
