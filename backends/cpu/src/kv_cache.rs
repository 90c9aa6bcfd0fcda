//! The paged KV cache in host memory, and the block copies between caches (copy-on-write
//! within the pool, swap to and from the swap space, which has the same layout).

use infer_core::block_manager::{check_copies, BlockCopy};
use infer_core::{BackendError, KvCacheSpec, Result};

/// The KV cache, and the swap space (same layout, in the same memory on this backend).
pub struct CpuKvCache {
    pub(crate) spec: KvCacheSpec,
    /// Per layer `[num_blocks, block_size, kv_heads, head_dim]`.
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
}

impl CpuKvCache {
    pub(crate) fn new(spec: &KvCacheSpec) -> Self {
        let per_layer = spec.num_blocks * spec.block_size * spec.num_kv_heads * spec.head_dim;
        // One `vec![0; n]` per layer (calloc: pages are touched only when used), not
        // `vec![row; layers]`, which would clone, and so write, every layer up front.
        let zeroed = || {
            (0..spec.num_layers)
                .map(|_| vec![0f32; per_layer])
                .collect()
        };
        CpuKvCache {
            spec: *spec,
            k: zeroed(),
            v: zeroed(),
        }
    }

    pub(crate) fn block_elems(&self) -> usize {
        self.spec.block_size * self.spec.num_kv_heads * self.spec.head_dim
    }

    /// Copy-on-write: whole blocks `(from, to)` within this cache, every layer.
    pub(crate) fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        let n = self.spec.num_blocks;
        check_copies("copy_blocks", copies, n, n).map_err(|e| e.on("cpu"))?;
        let e = self.block_elems();
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            for &(from, to) in copies {
                let (from, to) = (from as usize * e, to as usize * e);
                layer.copy_within(from..from + e, to);
            }
        }
        Ok(())
    }
}

/// Copies whole blocks `(from, to)` from `src` into `dst` (which may be the same cache).
pub(crate) fn copy_between(
    src: &CpuKvCache,
    dst: &mut CpuKvCache,
    copies: &[BlockCopy],
    op: &'static str,
) -> Result<()> {
    if src.block_elems() != dst.block_elems() || src.spec.num_layers != dst.spec.num_layers {
        return Err(BackendError::unsupported(
            op,
            format!(
                "copying blocks between caches {:?} and {:?}",
                src.spec, dst.spec
            ),
        )
        .on("cpu"));
    }
    check_copies(op, copies, src.spec.num_blocks, dst.spec.num_blocks).map_err(|e| e.on("cpu"))?;
    let e = src.block_elems();
    for layer in 0..src.spec.num_layers {
        for (s, d) in [(&src.k, &mut dst.k), (&src.v, &mut dst.v)] {
            for &(from, to) in copies {
                let (from, to) = (from as usize * e, to as usize * e);
                d[layer][to..to + e].copy_from_slice(&s[layer][from..from + e]);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(num_blocks: usize) -> KvCacheSpec {
        KvCacheSpec {
            num_layers: 2,
            num_blocks,
            block_size: 3,
            num_kv_heads: 2,
            head_dim: 4,
        }
    }

    /// Every value distinct and nonzero, so a misplaced copy cannot go unnoticed.
    fn filled(num_blocks: usize, seed: f32) -> CpuKvCache {
        let mut c = CpuKvCache::new(&spec(num_blocks));
        for (l, layer) in c.k.iter_mut().chain(c.v.iter_mut()).enumerate() {
            for (i, x) in layer.iter_mut().enumerate() {
                *x = seed + (l * 10_000 + i) as f32 * 0.5 + 1.0;
            }
        }
        c
    }

    fn block(c: &CpuKvCache, b: u32) -> Vec<f32> {
        let e = c.block_elems();
        let r = b as usize * e..(b as usize + 1) * e;
        c.k.iter()
            .chain(&c.v)
            .flat_map(|l| l[r.clone()].to_vec())
            .collect()
    }

    #[test]
    fn copy_blocks_copies_every_layer_of_k_and_v_and_nothing_else() {
        let mut c = filled(5, 0.0);
        let before: Vec<_> = (0..5).map(|b| block(&c, b)).collect();
        c.copy_blocks(&[(1, 3), (4, 0)]).unwrap();
        assert_eq!(block(&c, 3), before[1]);
        assert_eq!(block(&c, 0), before[4]);
        for b in [1, 2, 4] {
            assert_eq!(block(&c, b), before[b as usize]);
        }
        assert!(c.copy_blocks(&[(5, 0)]).is_err());
    }

    #[test]
    fn swap_out_and_back_in_restores_the_blocks_elsewhere() {
        let device = filled(4, 0.0);
        let mut swap = filled(3, 0.25);
        copy_between(&device, &mut swap, &[(2, 0), (3, 2)], "swap_out").unwrap();
        assert_eq!(block(&swap, 0), block(&device, 2));
        assert_eq!(block(&swap, 2), block(&device, 3));
        let mut fresh = filled(4, 0.75);
        copy_between(&swap, &mut fresh, &[(0, 1), (2, 0)], "swap_in").unwrap();
        assert_eq!(block(&fresh, 1), block(&device, 2));
        assert_eq!(block(&fresh, 0), block(&device, 3));
        assert!(copy_between(&device, &mut swap, &[(0, 3)], "swap_out").is_err());
        let other = CpuKvCache::new(&KvCacheSpec {
            head_dim: 8,
            ..spec(3)
        });
        assert!(copy_between(&device, &mut fresh, &[], "x").is_ok());
        assert!(copy_between(&other, &mut fresh, &[], "x").is_err());
    }
}
