//! The paged KV cache on the device (per layer, K and V each `[blocks * block_size, width]`
//! in f16) and the pinned host memory preempted blocks are swapped to.

use cudarc::driver::{CudaSlice, PinnedHostSlice};
use infer_core::backend::KvCacheSpec;

pub struct CudaKvCache {
    pub(crate) spec: KvCacheSpec,
    /// (K, V) per layer.
    pub(crate) layers: Vec<(CudaSlice<u16>, CudaSlice<u16>)>,
}

pub struct CudaSwapSpace {
    pub(crate) spec: KvCacheSpec,
    /// (K, V) per layer, page-locked so copies run asynchronously at full PCIe speed.
    pub(crate) layers: Vec<(PinnedHostSlice<u16>, PinnedHostSlice<u16>)>,
}

/// Elements of one block in one layer's K (or V).
pub fn block_elems(spec: &KvCacheSpec) -> usize {
    spec.block_size * spec.num_kv_heads * spec.head_dim
}
