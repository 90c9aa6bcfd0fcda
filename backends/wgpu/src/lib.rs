//! wgpu backend: the WGSL kernels of `shaders/` run through wgpu on Vulkan, Metal, DX12 and WebGPU (issue 5).
