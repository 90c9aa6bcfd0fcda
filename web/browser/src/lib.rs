//! infer in the browser: the same engine (block manager, scheduler, sampler, Llama forward)
//! on WebGPU through the wgpu backend, run in a Web Worker by `js/worker.js`. The worker
//! streams a GGUF file tensor by tensor into `WebLoader` (never more than one tensor's bytes
//! in wasm memory), builds a `WebEngine`, and steps it while requests are live; `js/infer.js`
//! gives the page an OpenAI-shaped API over the worker.

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]
// wgpu's handles are neither Send nor Sync on wasm32; the worker runs everything on one thread.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

pub mod session;

#[cfg(target_arch = "wasm32")]
mod engine;
#[cfg(target_arch = "wasm32")]
mod loader;

#[cfg(target_arch = "wasm32")]
pub use engine::WebEngine;
#[cfg(target_arch = "wasm32")]
pub use loader::WebLoader;

/// Engine settings for the browser (KV pool size aside): short prefill chunks keep steps
/// short, so streamed tokens of running requests are not held up by a long prompt; no swap
/// space (blocking read-backs are impossible there), so preemption recomputes.
pub const BLOCK_SIZE: usize = 16;
pub const MAX_NUM_SEQS: usize = 16;
pub const MAX_NUM_BATCHED_TOKENS: usize = 256;
/// The KV pool when the page names none (WebGPU cannot tell free memory).
pub const DEFAULT_KV_CACHE_MIB: usize = 256;
/// The smallest pool the out-of-memory fallback tries before giving up.
pub const MIN_KV_CACHE_MIB: usize = 8;

/// Panics show in the console with their message; `tracing` goes to the console.
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
    let config = tracing_wasm::WASMLayerConfigBuilder::new()
        .set_max_level(tracing::Level::INFO)
        .build();
    tracing_wasm::set_as_global_default_with_config(config);
}

/// Every WGSL kernel exactly as the engine compiles it (weight-storage headers included), as
/// JSON `[{name, source, entryPoints}]`: the browser tests compile each through the page's
/// own WebGPU (Chrome's Tint), which is stricter than naga in places.
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen(js_name = kernelSources)]
pub fn kernel_sources() -> String {
    let kernels: Vec<_> = infer_shaders::ALL
        .iter()
        .map(|k| {
            serde_json::json!({
                "name": k.name,
                "source": k.source,
                "entryPoints": k.entry_points,
            })
        })
        .collect();
    serde_json::Value::from(kernels).to_string()
}
