//! Weight rows as every level's kernels address them: f32 rows, or rows of 32-weight GGUF
//! blocks, each level decoding a block its own way (its `Rows` and `Block` traits).

use std::marker::PhantomData;

use crate::scale_table::f16_table;
use crate::tiles::prefetch_ahead;

/// A 32-weight GGUF block layout's size; each level implements its `Block` (the decoding).
pub(super) trait Layout {
    const BYTES: usize;
}

macro_rules! layouts {
    ($($name:ident: $bytes:literal),*) => {
        $(
            #[allow(non_camel_case_types)]
            pub(super) struct $name;
            impl Layout for $name {
                const BYTES: usize = $bytes;
            }
        )*
    };
}

// f16 d (+ f16 m), (u32 high bits), then the codes: ggml-common.h's block_q* structs.
layouts!(Q4_0: 18, Q4_1: 20, Q5_0: 22, Q5_1: 24, Q8_0: 34);

/// Rows of `k` weights, whatever their layout.
pub(super) trait RowSource {
    fn len(&self) -> usize;
    /// Hints the cache about the row a few after `j`.
    fn prefetch(&self, j: usize);
}

pub(super) struct F32Rows<'a> {
    data: &'a [f32],
    k: usize,
}

impl<'a> F32Rows<'a> {
    pub fn new(data: &'a [f32], k: usize) -> Self {
        assert!(data.len().is_multiple_of(k), "blocked: f32 rows of {k}");
        F32Rows { data, k }
    }

    /// The first of the 32 floats of block `blk` of row `j`.
    ///
    /// # Safety
    /// `j < len()` and `blk < k / 32`.
    #[inline(always)]
    pub unsafe fn block_ptr(&self, j: usize, blk: usize) -> *const f32 {
        // SAFETY: the caller's contract keeps the offset inside `data`.
        unsafe { self.data.as_ptr().add(j * self.k + blk * 32) }
    }
}

impl RowSource for F32Rows<'_> {
    fn len(&self) -> usize {
        self.data.len() / self.k
    }
    #[inline(always)]
    fn prefetch(&self, j: usize) {
        prefetch_ahead(self.data, j, self.k);
    }
}

pub(super) struct BlockRows<'a, B> {
    data: &'a [u8],
    row_bytes: usize,
    /// f16 bits → f32, for the block scales.
    pub table: &'static [f32],
    block: PhantomData<B>,
}

impl<'a, B: Layout> BlockRows<'a, B> {
    pub fn new(data: &'a [u8], k: usize) -> Self {
        let row_bytes = k / 32 * B::BYTES;
        assert!(
            k.is_multiple_of(32) && data.len().is_multiple_of(row_bytes),
            "blocked: packed rows of {k}"
        );
        BlockRows {
            data,
            row_bytes,
            table: f16_table(),
            block: PhantomData,
        }
    }

    /// The first byte of block `blk` of row `j`.
    ///
    /// # Safety
    /// `j < len()` and `blk < k / 32`.
    #[inline(always)]
    pub unsafe fn block_ptr(&self, j: usize, blk: usize) -> *const u8 {
        // SAFETY: the caller's contract keeps the offset inside `data`.
        unsafe { self.data.as_ptr().add(j * self.row_bytes + blk * B::BYTES) }
    }
}

impl<B: Layout> RowSource for BlockRows<'_, B> {
    fn len(&self) -> usize {
        self.data.len() / self.row_bytes
    }
    #[inline(always)]
    fn prefetch(&self, j: usize) {
        prefetch_ahead(self.data, j, self.row_bytes);
    }
}
