//! wgpu backend: the WGSL kernels of `shaders/` run through wgpu on Vulkan, Metal, DX12 and
//! WebGPU. (Work in progress: the context, buffers and kernel dispatches; the `Backend`
//! implementation comes next.)

mod buffers;
mod context;
mod kernels;

pub use buffers::WG;
pub use context::{GpuContext, GpuError, GpuResult};
pub use kernels::AttentionShape;
