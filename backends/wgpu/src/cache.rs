//! The paged KV cache on the device (one K and one V buffer per layer, rows
//! `[slot, kv_heads * head_dim]`), its host swap space, and the block moves between them.

use infer_core::backend::KvCacheSpec;
use infer_core::block_manager::{check_copies, BlockCopy};
use infer_core::error::Result;

use crate::context::{gpu_err, wgpu_err};
use crate::device::WgpuBackend;
use crate::pool::GpuBuffer;

pub struct WgpuKvCache {
    pub(crate) spec: KvCacheSpec,
    /// Per layer: K and V.
    pub(crate) layers: Vec<(GpuBuffer, GpuBuffer)>,
}

/// Host copies of swapped-out blocks, laid out like the device cache.
pub struct WgpuSwapSpace {
    spec: KvCacheSpec,
    layers: Vec<(Vec<f32>, Vec<f32>)>,
}

/// Floats per cache row and per block.
pub(crate) fn row_and_block(spec: &KvCacheSpec) -> (usize, usize) {
    let row = spec.num_kv_heads * spec.head_dim;
    (row, row * spec.block_size)
}

fn check_blocks(op: &'static str, copies: &[BlockCopy], from: usize, to: usize) -> Result<()> {
    check_copies(op, copies, from, to).map_err(wgpu_err)
}

impl WgpuBackend {
    pub(crate) fn new_kv_cache(&self, spec: &KvCacheSpec) -> Result<WgpuKvCache> {
        let (_, block) = row_and_block(spec);
        let bytes = (spec.num_blocks * block * 4) as u64;
        self.check_binding("KV cache layer", bytes)?;
        let layers = (0..spec.num_layers)
            .map(|_| (self.ctx.zeroed(bytes), self.ctx.zeroed(bytes)))
            .collect();
        Ok(WgpuKvCache {
            spec: *spec,
            layers,
        })
    }

    pub(crate) fn new_swap_space(spec: &KvCacheSpec) -> WgpuSwapSpace {
        let (_, block) = row_and_block(spec);
        let floats = spec.num_blocks * block;
        WgpuSwapSpace {
            spec: *spec,
            layers: (0..spec.num_layers)
                .map(|_| (vec![0f32; floats], vec![0f32; floats]))
                .collect(),
        }
    }

    /// Records whole-block copies into the step's encoder (they run before its forward).
    pub(crate) fn record_block_copies(
        &self,
        cache: &WgpuKvCache,
        copies: &[BlockCopy],
    ) -> Result<()> {
        let n = cache.spec.num_blocks;
        check_blocks("copy_blocks", copies, n, n)?;
        if copies.is_empty() {
            return Ok(());
        }
        let flat: Vec<u32> = copies.iter().flat_map(|&(f, t)| [f, t]).collect();
        let pairs = self.ctx.stage_u32(&flat);
        let block = row_and_block(&cache.spec).1;
        for (k, v) in &cache.layers {
            for buf in [k, v] {
                self.ctx
                    .copy_blocks(buf, &pairs, copies.len(), block)
                    .map_err(gpu_err)?;
            }
        }
        Ok(())
    }

    /// Reads only the listed blocks back, every layer, in one submission.
    pub(crate) fn read_blocks_to_host(
        &self,
        cache: &WgpuKvCache,
        swap: &mut WgpuSwapSpace,
        copies: &[BlockCopy],
    ) -> Result<()> {
        check_blocks(
            "swap_out",
            copies,
            cache.spec.num_blocks,
            swap.spec.num_blocks,
        )?;
        let block = row_and_block(&cache.spec).1;
        let bytes = (block * 4) as u64;
        let mut ranges = Vec::with_capacity(cache.layers.len() * copies.len() * 2);
        for (k, v) in &cache.layers {
            for buf in [k, v] {
                for &(dev, _) in copies {
                    ranges.push((&**buf, dev as u64 * bytes, bytes));
                }
            }
        }
        let data = self.ctx.read_bytes(&ranges).map_err(gpu_err)?;
        let floats: &[f32] = bytemuck::cast_slice(&data);
        let mut chunks = floats.chunks_exact(block);
        for (hk, hv) in &mut swap.layers {
            for host in [hk, hv] {
                for (&(_, h), src) in copies.iter().zip(chunks.by_ref()) {
                    let h = h as usize * block;
                    host[h..h + block].copy_from_slice(src);
                }
            }
        }
        Ok(())
    }

    /// Writes host blocks back into the device cache, ahead of the step's recorded work.
    pub(crate) fn write_blocks_from_host(
        &self,
        swap: &WgpuSwapSpace,
        cache: &WgpuKvCache,
        copies: &[BlockCopy],
    ) -> Result<()> {
        check_blocks(
            "swap_in",
            copies,
            swap.spec.num_blocks,
            cache.spec.num_blocks,
        )?;
        // Queue writes land before the next submission's commands: submit what is recorded
        // first so no earlier command sees the new contents.
        self.ctx.flush().map_err(gpu_err)?;
        let block = row_and_block(&swap.spec).1;
        for ((hk, hv), (k, v)) in swap.layers.iter().zip(&cache.layers) {
            for &(host, dev) in copies {
                let (h, offset) = (host as usize * block, (dev as usize * block * 4) as u64);
                self.ctx
                    .queue
                    .write_buffer(k, offset, bytemuck::cast_slice(&hk[h..h + block]));
                self.ctx
                    .queue
                    .write_buffer(v, offset, bytemuck::cast_slice(&hv[h..h + block]));
            }
        }
        Ok(())
    }
}
