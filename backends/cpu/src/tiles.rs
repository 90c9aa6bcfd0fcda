//! How the streaming kernels split a matmul's output over the pool (`by_column_tiles`, in
//! tiles of `streaming_tile` columns) and ask the cache for the weight rows ahead of them
//! (`prefetch_ahead`). Below every kernel module (`matmul`, `blocked`, `quant`, `qdot`), which
//! all use them.

use rayon::prelude::*;

/// The largest tile (the weight rows one task streams) whose rows `prefetch_ahead` asks for.
/// A long sequential stream is what the hardware prefetchers follow best, and software hints
/// on it only queue behind them: on a 2-core AMD EPYC, the Q4_K kernels streamed 8192 × 2048
/// and 2048 × 8192 matrices (tiles of 590 / 655 KB) at 26 GB/s without the hints and 17 with,
/// and a 1B Llama decoded at 17.8 against 14.6 tok/s (Q8_0) and 16.6 against 15.6 (Q4_1),
/// medians of 6 alternated runs. Short tiles (SmolLM2's hidden matrices: 13-62 KB) keep them:
/// they were measured worth 10-30 % on a Xeon (see the README).
const PREFETCH_MAX_TILE_BYTES: usize = 128 << 10;

/// How many weight rows ahead of the one being dotted the streaming kernels ask the cache for.
/// Weights stream from L3 or DRAM once per step, and the hardware prefetcher alone leaves the
/// core waiting on them: on the 2-core Xeon of the README, SmolLM2 decode went from 81 to
/// 104 tok/s (Q8_0) and from 103 to 116 tok/s (Q4_K_M) with this hint (2 rows: 109 on Q4_K_M).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const PREFETCH_ROWS: usize = 4;

/// Asks for weight row `j + PREFETCH_ROWS` of `rows` (rows of `row_len` elements), if there
/// is one and the tile `rows` is short enough to gain from it.
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(rows: &[T], j: usize, row_len: usize) {
    if std::mem::size_of_val(rows) > PREFETCH_MAX_TILE_BYTES {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let ahead = (j + PREFETCH_ROWS) * row_len;
        if let Some(next) = rows.get(ahead..ahead + row_len) {
            for line in next.chunks(64 / std::mem::size_of::<T>().max(1)) {
                // SAFETY: a hint on an in-bounds address; SSE is part of x86-64.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let ahead = (j + PREFETCH_ROWS) * row_len;
        if let Some(next) = rows.get(ahead..ahead + row_len) {
            for line in next.chunks(64 / std::mem::size_of::<T>().max(1)) {
                // SAFETY: a prefetch hint on an in-bounds address; it reads nothing
                // architecturally and cannot fault.
                unsafe {
                    std::arch::asm!(
                        "prfm pldl1keep, [{p}]",
                        p = in(reg) line.as_ptr(),
                        options(nostack, readonly, preserves_flags)
                    )
                };
            }
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (rows, j, row_len);
}

/// Output columns per task when each weight row is streamed once: wide enough to amortize
/// scheduling, narrow enough that every thread gets several tiles.
pub(crate) fn streaming_tile(n: usize) -> usize {
    (n / (rayon::current_num_threads() * 8)).clamp(16, 512)
}

/// Computes an `[m, n]` row-major output in parallel column tiles of `tile` columns:
/// `f(c0, c1, part)` fills `part` as `[m, c1 - c0]`, and the tiles are stitched together.
pub(crate) fn by_column_tiles(
    m: usize,
    n: usize,
    tile: usize,
    f: impl Fn(usize, usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let tile = tile.max(1);
    if m == 1 {
        // One row: the tiles are disjoint slices of the output, filled in place.
        let mut out = vec![0f32; n];
        out.par_chunks_mut(tile)
            .enumerate()
            .for_each(|(t, part)| f(t * tile, t * tile + part.len(), part));
        return out;
    }
    let mut out = vec![0f32; m * n];
    let rows = RowsOut(out.as_mut_ptr());
    (0..n)
        .step_by(tile)
        .collect::<Vec<_>>()
        .into_par_iter()
        .for_each(|c0| {
            let c1 = (c0 + tile).min(n);
            let width = c1 - c0;
            let mut part = vec![0f32; m * width];
            f(c0, c1, &mut part);
            // Each task places its own columns (the copies were a serial pass after all tiles,
            // 2-3 % of a 32-request step).
            for (i, row) in part.chunks_exact(width).enumerate() {
                // SAFETY: `out` holds `m * n` values and outlives this loop; row `i`'s columns
                // `c0..c1` are inside it and written by this task alone (tiles are disjoint).
                unsafe { rows.write(i * n + c0, row) };
            }
        });
    out
}

/// The output of `by_column_tiles`, shared by its tasks, each writing its own columns.
#[derive(Clone, Copy)]
struct RowsOut(*mut f32);

// SAFETY: the tasks write disjoint ranges through it (see `write`'s callers) while the vector
// it points into is alive and not otherwise accessed.
unsafe impl Send for RowsOut {}
// SAFETY: as above.
unsafe impl Sync for RowsOut {}

impl RowsOut {
    /// # Safety
    /// `at..at + values.len()` is inside the output and no other task writes it.
    unsafe fn write(self, at: usize, values: &[f32]) {
        // SAFETY: the caller's contract; `values` is a separate allocation.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.0.add(at), values.len()) };
    }
}
