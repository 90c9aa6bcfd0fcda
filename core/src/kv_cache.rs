//! A minimal block allocator: index-based free list and per-sequence block tables.
//! (The block manager with reference counts, copy-on-write and prefix caching replaces it.)

use crate::error::{InferError, Result};

#[derive(Debug, Clone)]
pub struct BlockAllocator {
    free: Vec<u32>,
    num_blocks: usize,
    block_size: usize,
}

impl BlockAllocator {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        // Pop from the end, so hand out low ids first.
        BlockAllocator {
            free: (0..num_blocks as u32).rev().collect(),
            num_blocks,
            block_size,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Grows `table` so it holds `num_tokens` tokens.
    pub fn ensure_capacity(&mut self, table: &mut Vec<u32>, num_tokens: usize) -> Result<()> {
        let needed = num_tokens.div_ceil(self.block_size);
        while table.len() < needed {
            let block = self.free.pop().ok_or_else(|| {
                InferError::KvCache(format!(
                    "out of blocks: {num_tokens} tokens need {needed} of {} blocks",
                    self.num_blocks
                ))
            })?;
            table.push(block);
        }
        Ok(())
    }

    pub fn release(&mut self, table: &mut Vec<u32>) {
        self.free.append(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_whole_blocks_and_reuses_freed_ones() {
        let mut a = BlockAllocator::new(3, 16);
        let mut t = Vec::new();
        a.ensure_capacity(&mut t, 17).unwrap();
        assert_eq!(t, [0, 1]);
        assert!(a.ensure_capacity(&mut t, 49).is_err());
        a.release(&mut t);
        assert_eq!(a.num_free(), 3);
    }
}
