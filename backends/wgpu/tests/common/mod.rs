//! Shared by the wgpu tests: one adapter per test binary (pinned to Vulkan: without a driver
//! wgpu would fall back to GL and crawl; no adapter is a failure, not a skip), random data, the
//! comparison, and ragged batches over shuffled blocks.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use infer_wgpu::{GpuContext, WeightStorage, WgpuBackend};

fn open_context() -> GpuContext {
    let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::VULKAN);
    let ctx = pollster::block_on(GpuContext::open(
        backends,
        std::env::var("WGPU_ADAPTER_NAME").ok(),
    ))
    .unwrap_or_else(|e| panic!("the wgpu tests need an adapter: {e}"));
    // Every kernel output starts as NaN, so an element a kernel misses fails.
    ctx.set_poison_outputs(true);
    ctx
}

pub fn gpu_context() -> Arc<GpuContext> {
    static CTX: OnceLock<Arc<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| Arc::new(open_context())).clone()
}

/// One context per kernel set (cooperative, then barrier-free) whatever the adapter picks by
/// default, so both sets are checked on every adapter.
pub fn kernel_set_contexts() -> [Arc<GpuContext>; 2] {
    static SETS: OnceLock<[Arc<GpuContext>; 2]> = OnceLock::new();
    SETS.get_or_init(|| {
        [false, true].map(|barrier_free| {
            let ctx = open_context();
            ctx.set_barrier_free_kernels(barrier_free);
            Arc::new(ctx)
        })
    })
    .clone()
}

pub fn gpu(weights: WeightStorage) -> WgpuBackend {
    WgpuBackend::with_context(gpu_context(), weights)
}

pub fn gpu_on(ctx: &Arc<GpuContext>, weights: WeightStorage) -> WgpuBackend {
    WgpuBackend::with_context(ctx.clone(), weights)
}

#[allow(unused_imports)]
pub use infer_tests::conformance::{assert_close, batch, cpu, host, random, up};
