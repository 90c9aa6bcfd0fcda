//! `WgpuBackend` itself: one adapter's context, how weights are stored on it and the binding
//! limit they are split at. The `Backend` trait's methods are in `backend`, the KV cache's in
//! `cache`, the experts' routing in `moe`; all of them build on this.

use std::sync::Arc;

use infer_core::error::Result;
use infer_core::BackendError;

use crate::context::{gpu_err, wgpu_err, GpuContext};
use crate::kernels::WeightStorage;
use crate::pool::GpuBuffer;
use crate::tensor::WgpuTensor;

#[derive(Clone)]
pub struct WgpuBackend {
    pub(crate) ctx: Arc<GpuContext>,
    /// How weight matrices are stored.
    pub(crate) weights: WeightStorage,
    /// Largest storage binding (the adapter's, lowered in tests to exercise splitting).
    pub(crate) max_binding: u64,
}

impl WgpuBackend {
    /// Opens the adapter chosen by `WGPU_BACKEND` / `WGPU_ADAPTER_NAME` (see `GpuContext`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(weights: WeightStorage) -> Result<Self> {
        let ctx = Arc::new(GpuContext::new().map_err(gpu_err)?);
        Ok(Self::with_context(ctx, weights))
    }

    pub fn with_context(ctx: Arc<GpuContext>, weights: WeightStorage) -> Self {
        let max_binding = ctx.limits.max_storage_buffer_binding_size;
        WgpuBackend {
            ctx,
            weights,
            max_binding,
        }
    }

    /// Lowers the binding limit weights are split at (tests of the splitting path).
    pub fn with_max_binding(mut self, bytes: u64) -> Self {
        self.max_binding = bytes.min(self.max_binding);
        self
    }

    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    pub(crate) fn check_binding(&self, what: &'static str, bytes: u64) -> Result<()> {
        if bytes > self.max_binding {
            return Err(wgpu_err(BackendError::too_large(
                what,
                "bytes in one storage binding",
                bytes,
                self.max_binding,
            )));
        }
        Ok(())
    }

    pub(crate) fn out(
        &self,
        r: crate::context::GpuResult<GpuBuffer>,
        shape: Vec<usize>,
    ) -> Result<WgpuTensor> {
        Ok(WgpuTensor::activation(r.map_err(gpu_err)?, shape))
    }
}
