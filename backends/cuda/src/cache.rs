//! The paged KV cache on the device (per layer, K and V each `[blocks * block_size, width]`
//! in f16) and the pinned host memory preempted blocks are swapped to.

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaSlice, PinnedHostSlice, PushKernelArg};
use infer_core::backend::KvCacheSpec;
use infer_core::block_manager::{check_copies, BlockCopy};
use infer_core::error::Result;
use infer_core::BackendError;

use crate::backend::CudaBackend;
use crate::batch::CudaBatch;
use crate::device::launch_rows;
use crate::error::u32_arg;
use crate::error::{cuda_err, CudaError};
use crate::tensor::CudaTensor;

type CudaResult<T> = std::result::Result<T, CudaError>;

pub struct CudaKvCache {
    /// Tells caches apart (CUDA graphs record one cache's buffers).
    pub(crate) id: u64,
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

/// Block copies `(from, to)` within `from_blocks` and `to_blocks` (slicing panics otherwise).
fn check_blocks(
    op: &'static str,
    copies: &[BlockCopy],
    from_blocks: usize,
    to_blocks: usize,
) -> CudaResult<()> {
    Ok(check_copies(op, copies, from_blocks, to_blocks)?)
}

impl CudaBackend {
    pub(crate) fn new_kv_cache(&self, spec: &KvCacheSpec) -> Result<CudaKvCache> {
        let elems = spec.num_blocks * block_elems(spec);
        let layers = (0..spec.num_layers)
            .map(|_| {
                let k = self.dev.stream.alloc_zeros::<u16>(elems.max(1))?;
                let v = self.dev.stream.alloc_zeros::<u16>(elems.max(1))?;
                Ok((k, v))
            })
            .collect::<CudaResult<Vec<_>>>()?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(CudaKvCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            spec: *spec,
            layers,
        })
    }

    pub(crate) fn new_swap_space(&self, spec: &KvCacheSpec) -> Result<CudaSwapSpace> {
        let elems = (spec.num_blocks * block_elems(spec)).max(1);
        let layers = (0..spec.num_layers)
            .map(|_| {
                // SAFETY: page-locked host memory of `elems` u16, only ever written by copies
                // from the device before it is read.
                let k = unsafe { self.dev.ctx.alloc_pinned::<u16>(elems) }?;
                // SAFETY: as above.
                let v = unsafe { self.dev.ctx.alloc_pinned::<u16>(elems) }?;
                Ok((k, v))
            })
            .collect::<CudaResult<Vec<_>>>()?;
        Ok(CudaSwapSpace {
            spec: *spec,
            layers,
        })
    }

    pub(crate) fn copy_kv_blocks(
        &self,
        cache: &mut CudaKvCache,
        copies: &[BlockCopy],
    ) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        check_blocks(
            "copy_blocks",
            copies,
            cache.spec.num_blocks,
            cache.spec.num_blocks,
        )?;
        let pairs: Vec<u32> = copies.iter().flat_map(|&(from, to)| [from, to]).collect();
        let pairs = self.upload_u32(&pairs)?;
        let elems = u32_arg("copy_blocks", block_elems(&cache.spec))?;
        let f = self.dev.function("copy_blocks")?;
        for (k, v) in &mut cache.layers {
            for buf in [k, v] {
                let mut b = self.dev.stream.launch_builder(f);
                b.arg(buf).arg(&pairs).arg(&elems);
                // SAFETY: copy_blocks(f16*, const u32*, u32); every block id is below the
                // cache's block count (the block manager's), one thread block per pair.
                unsafe { launch_rows(&mut b, copies.len(), 256) }?;
            }
        }
        Ok(())
    }

    pub(crate) fn swap_out_blocks(
        &self,
        cache: &CudaKvCache,
        swap: &mut CudaSwapSpace,
        copies: &[BlockCopy],
    ) -> Result<()> {
        check_blocks(
            "swap_out",
            copies,
            cache.spec.num_blocks,
            swap.spec.num_blocks,
        )?;
        let n = block_elems(&cache.spec);
        for ((dk, dv), (hk, hv)) in cache.layers.iter().zip(&mut swap.layers) {
            for (dev, host) in [(dk, hk), (dv, hv)] {
                let host = host.as_mut_slice().map_err(CudaError::from)?;
                for &(from, to) in copies {
                    let (from, to) = (from as usize, to as usize);
                    let src = dev.slice(from * n..(from + 1) * n);
                    let dst = &mut host[to * n..(to + 1) * n];
                    self.dev
                        .stream
                        .memcpy_dtoh(&src, dst)
                        .map_err(CudaError::from)?;
                }
            }
        }
        self.dev.stream.synchronize().map_err(CudaError::from)?;
        Ok(())
    }

    pub(crate) fn swap_in_blocks(
        &self,
        swap: &CudaSwapSpace,
        cache: &mut CudaKvCache,
        copies: &[BlockCopy],
    ) -> Result<()> {
        check_blocks(
            "swap_in",
            copies,
            swap.spec.num_blocks,
            cache.spec.num_blocks,
        )?;
        let n = block_elems(&cache.spec);
        for ((hk, hv), (dk, dv)) in swap.layers.iter().zip(&mut cache.layers) {
            for (host, dev) in [(hk, dk), (hv, dv)] {
                let host = host.as_slice().map_err(CudaError::from)?;
                for &(from, to) in copies {
                    let (from, to) = (from as usize, to as usize);
                    let src = &host[from * n..(from + 1) * n];
                    let mut dst = dev.slice_mut(to * n..(to + 1) * n);
                    self.dev
                        .stream
                        .memcpy_htod(src, &mut dst)
                        .map_err(CudaError::from)?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn write_kv_rows(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        k: &CudaTensor,
        v: &CudaTensor,
        batch: &CudaBatch,
    ) -> Result<()> {
        let spec = cache.spec;
        let width = spec.num_kv_heads * spec.head_dim;
        let n = batch.input.num_tokens();
        let slots = spec.num_blocks * spec.block_size;
        if layer >= cache.layers.len() {
            let e =
                BackendError::out_of_range("write_kv", "layer", layer as u64, cache.layers.len());
            return Err(cuda_err(e));
        }
        if k.len() != n * width || v.len() != n * width {
            return Err(cuda_err(BackendError::shape(
                "write_kv",
                &[("k", &k.shape), ("v", &v.shape)],
                format!("k and v [{n} tokens, {width}]"),
            )));
        }
        // Padding tokens of a CUDA graph's batch (slot PAD_SLOT) are not in `max_slot`;
        // the kernel skips them.
        if let Some(s) = batch.max_slot.filter(|&s| s as usize >= slots) {
            return Err(cuda_err(BackendError::out_of_range(
                "write_kv", "slot", s, slots,
            )));
        }
        let w = u32_arg("write_kv", width)?;
        let (kc, vc) = &mut cache.layers[layer];
        let mut b = self
            .dev
            .stream
            .launch_builder(self.dev.function("write_kv")?);
        b.arg(k.f32("write_kv")?)
            .arg(v.f32("write_kv")?)
            .arg(kc)
            .arg(vc);
        b.arg(&batch.slots).arg(&w);
        // SAFETY: write_kv(const float*, const float*, f16*, f16*, const u32*, u32): slots
        // checked against the cache, one block per token.
        unsafe { launch_rows(&mut b, n, 128) }?;
        Ok(())
    }
}
