//! A step's batch on the device: the host's `BatchInput` with its index arrays uploaded, and
//! the bounds the per-layer kernels check against instead of rescanning the batch.

use cudarc::driver::CudaSlice;
use infer_core::batch::BatchInput;

pub struct CudaBatch {
    pub(crate) input: BatchInput,
    pub(crate) token_ids: CudaSlice<u32>,
    pub(crate) positions: CudaSlice<u32>,
    pub(crate) slots: CudaSlice<u32>,
    pub(crate) token_seq: CudaSlice<u32>,
    pub(crate) block_tables: CudaSlice<u32>,
    pub(crate) logits_indices: CudaSlice<u32>,
    /// Largest context any token of the step attends over.
    pub(crate) max_context: usize,
    /// 512-key partitions the attention grid has: enough for `max_context` (a CUDA graph's
    /// batch has more, for the contexts of the steps that replay it).
    pub(crate) attention_parts: usize,
    /// Largest KV slot written and block id read: the per-layer checks against the cache
    /// compare these instead of scanning the batch every layer.
    pub(crate) max_slot: Option<u32>,
    pub(crate) max_block: Option<u32>,
}
