//! Q4_K matrices repacked at load into groups of 8 rows whose blocks are interleaved byte by
//! byte (llama.cpp's `--repack`, in a layout of our own), so that single-row decode handles 8
//! output rows per register: each 32-byte load holds 4 weights of each of the 8 rows, meets
//! those 4 activations broadcast to every lane, and sums in i16 across a whole 32-weight
//! sub-block before the sub-block scales (one lane per row) are applied once. The row-major
//! kernel (`fused::kquant`) spends a scale multiply-add per 32 weights and row, plus a scalar
//! decode of each block's 6-bit scales and a horizontal sum per row; here the scales are
//! decoded at load and the 8 rows' dots come out of one vector. At the 1B shape's 8192 × 2048
//! matrices it runs at the machine's DRAM rate where the row-major one was bound by
//! instructions (see the README).
//!
//! One group-block (`GROUP_BLOCK` bytes: block `b` of rows `8g..8g+8`):
//! - `d[8]`, `dmin[8]`: the rows' f16 super-block scales, as stored;
//! - `scales[8][8]`, `mins[8][8]`: sub-block `s`'s 6-bit scale and min of row `r` at `8s + r`,
//!   decoded from the 12 packed bytes;
//! - `qs[8][4][32]`: for sub-block `s` and chunk `c` (its weights `8c..8c+8`), byte `4r + i`
//!   holds weight `8c + i` of row `r` in its low nibble and weight `8c + 4 + i` in its high one.
//!
//! The repacking is a bijection (`rows_of` gives back the stored bytes exactly); the other
//! paths (prefill GEMM on decoded tiles, embedding rows) decode the interleaved rows to the
//! values ggml's dequantization gives, so results do not depend on the layout beyond f32
//! rounding.

#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use infer_core::gguf::kquants::scale_min_k4;
use infer_core::gguf::GgmlType;
use rayon::prelude::*;

use super::activations::Q8Rows;
use crate::matmul::{by_column_tiles, streaming_tile};

/// Rows per interleaved group.
pub(crate) const ROWS: usize = 8;

/// Bytes of a Q4_K block.
const BLOCK: usize = 144;

/// Bytes of one group-block: the 8 rows' block `b`.
pub(crate) const GROUP_BLOCK: usize = 16 + 16 + 64 + 64 + 1024;

/// How a packed matrix's bytes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Rows of whole blocks, as stored in GGUF.
    Rows,
    /// Groups of `ROWS` rows interleaved (this module).
    Interleaved,
}

/// Whether a `[n, k]` matrix of `dtype` has an interleaved form whose kernels this CPU runs.
pub(crate) fn interleavable(dtype: GgmlType, n: usize, k: usize) -> bool {
    dtype == GgmlType::Q4K
        && n > 0
        && n.is_multiple_of(ROWS)
        && k > 0
        && k.is_multiple_of(256)
        && kernels_available()
}

fn kernels_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::isa::Isa::current().has_avx2() && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The interleaved form of the Q4_K rows `w` (`[n, k]`, `n` a multiple of 8, `k` of 256), in
/// parallel over the groups.
pub(crate) fn interleave(w: &[u8], n: usize, k: usize) -> Vec<u8> {
    let nb = k / 256;
    let row_bytes = nb * BLOCK;
    assert_eq!(w.len(), n * row_bytes, "interleave: not [n, k] Q4_K rows");
    let mut out = vec![0u8; n / ROWS * nb * GROUP_BLOCK];
    out.par_chunks_mut(nb * GROUP_BLOCK)
        .zip(w.par_chunks(ROWS * row_bytes))
        .for_each(|(group, rows)| {
            for (b, gb) in group.chunks_exact_mut(GROUP_BLOCK).enumerate() {
                for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
                    pack_block(&row[b * BLOCK..(b + 1) * BLOCK], r, gb);
                }
            }
        });
    out
}

/// Weight `i` (0..256) of a Q4_K block's `qs`: byte `32 (i / 64) + i % 32`, low nibble for
/// the first 32 of each 64.
fn nibble_at(i: usize) -> (usize, u32) {
    (32 * (i / 64) + i % 32, if i % 64 < 32 { 0 } else { 4 })
}

/// Where weight `8c + i` (low nibble) and `8c + 4 + i` (high) of sub-block `s` of row `r` go.
fn qs_at(s: usize, c: usize, r: usize, i: usize) -> usize {
    160 + 128 * s + 32 * c + 4 * r + i
}

/// Writes row `r`'s `block` into the group-block `gb`.
fn pack_block(block: &[u8], r: usize, gb: &mut [u8]) {
    gb[2 * r..2 * r + 2].copy_from_slice(&block[0..2]);
    gb[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&block[2..4]);
    for s in 0..8 {
        let (sc, mn) = scale_min_k4(s, &block[4..16]);
        gb[32 + 8 * s + r] = sc as u8;
        gb[96 + 8 * s + r] = mn as u8;
    }
    let qs = &block[16..BLOCK];
    let weight = |i: usize| {
        let (byte, shift) = nibble_at(i);
        (qs[byte] >> shift) & 0x0f
    };
    for s in 0..8 {
        for c in 0..4 {
            for i in 0..4 {
                let (lo, hi) = (weight(32 * s + 8 * c + i), weight(32 * s + 8 * c + 4 + i));
                gb[qs_at(s, c, r, i)] = lo | (hi << 4);
            }
        }
    }
}

/// Reads row `r`'s block back out of the group-block `gb`, as stored.
#[cfg(test)]
fn unpack_block(gb: &[u8], r: usize, block: &mut [u8]) {
    block[0..2].copy_from_slice(&gb[2 * r..2 * r + 2]);
    block[2..4].copy_from_slice(&gb[16 + 2 * r..16 + 2 * r + 2]);
    // The 12 bytes `scale_min_k4` reads: scales and mins 0..4 in the low six bits of bytes
    // 0..4 and 4..8, 4..8 as nibbles of bytes 8..12 with their top two bits above 0..8.
    let scales = &mut block[4..16];
    scales.fill(0);
    for s in 0..8 {
        let (sc, mn) = (gb[32 + 8 * s + r], gb[96 + 8 * s + r]);
        if s < 4 {
            scales[s] |= sc & 63;
            scales[s + 4] |= mn & 63;
        } else {
            scales[s + 4] = (sc & 0x0f) | ((mn & 0x0f) << 4);
            scales[s - 4] |= (sc >> 4) << 6;
            scales[s] |= (mn >> 4) << 6;
        }
    }
    let qs = &mut block[16..BLOCK];
    qs.fill(0);
    for s in 0..8 {
        for c in 0..4 {
            for i in 0..4 {
                let byte = gb[qs_at(s, c, r, i)];
                for (weight, nib) in [
                    (32 * s + 8 * c + i, byte & 0x0f),
                    (32 * s + 8 * c + 4 + i, byte >> 4),
                ] {
                    let (at, shift) = nibble_at(weight);
                    qs[at] |= nib << shift;
                }
            }
        }
    }
}

/// The stored rows `r0..r1` of an interleaved `[n, k]` Q4_K matrix, into `out` (the tests'
/// proof that the repacking loses nothing).
#[cfg(test)]
pub(crate) fn rows_of(data: &[u8], k: usize, r0: usize, r1: usize, out: &mut Vec<u8>) {
    let nb = k / 256;
    let row_bytes = nb * BLOCK;
    out.clear();
    out.resize((r1 - r0) * row_bytes, 0);
    for (r, row) in (r0..r1).zip(out.chunks_exact_mut(row_bytes)) {
        let group = &data[r / ROWS * nb * GROUP_BLOCK..(r / ROWS + 1) * nb * GROUP_BLOCK];
        for (gb, block) in group
            .chunks_exact(GROUP_BLOCK)
            .zip(row.chunks_exact_mut(BLOCK))
        {
            unpack_block(gb, r % ROWS, block);
        }
    }
}

/// One activation row as the interleaved kernels read it: one or two planes (a value and its
/// residual, whose step is exactly the value's / 256, `activations::quantize_residual`).
pub(crate) struct ActRow<'a> {
    value: &'a [i8],
    residual: Option<&'a [i8]>,
    /// Per 32 values: the value codes summed, times 256 plus the residual codes summed where
    /// there is a residual (the sums the weights' mins meet).
    code_sums: Vec<i32>,
    /// Per 256 values: the step the integer sums are counted in (the residual's, or the
    /// value's with one plane).
    steps: &'a [f32],
}

impl<'a> ActRow<'a> {
    /// Row `r` of the planes (quantized in groups of 256).
    pub(crate) fn new(planes: &'a [Q8Rows], r: usize) -> Self {
        debug_assert!(planes.iter().all(|p| p.group == 256) && (1..=2).contains(&planes.len()));
        let value = planes[0].row(r);
        let residual = planes.get(1).map(|p| p.row(r));
        let sum32 = |s: &[i16]| -> Vec<i32> {
            s.chunks_exact(2)
                .map(|p| p[0] as i32 + p[1] as i32)
                .collect()
        };
        let mut code_sums = sum32(value.code_sums);
        if let Some(res) = &residual {
            for (c, r) in code_sums.iter_mut().zip(sum32(res.code_sums)) {
                *c = 256 * *c + r;
            }
        }
        ActRow {
            value: value.codes,
            residual: residual.map(|r| r.codes),
            code_sums,
            steps: residual.map_or(value.group_scales, |r| r.group_scales),
        }
    }
}

/// `out [m, n] = x · wᵀ` for an interleaved `[n, k]` Q4_K matrix on the activation planes of
/// `m` rows (the integer path).
pub(crate) fn matmul(planes: &[Q8Rows], data: &[u8], m: usize, k: usize, n: usize) -> Vec<f32> {
    let nb = k / 256;
    assert_eq!(
        data.len(),
        n / ROWS * nb * GROUP_BLOCK,
        "interleaved: not [n, k]"
    );
    let rows: Vec<ActRow> = (0..m).map(|r| ActRow::new(planes, r)).collect();
    let dot = group_kernel();
    let tile = (streaming_tile(n) / ROWS * ROWS).max(ROWS);
    by_column_tiles(m, n, tile, |c0, c1, part| {
        let width = c1 - c0;
        for (i, group) in data[c0 / ROWS * nb * GROUP_BLOCK..c1 / ROWS * nb * GROUP_BLOCK]
            .chunks_exact(nb * GROUP_BLOCK)
            .enumerate()
        {
            for (r, x) in rows.iter().enumerate() {
                let at = r * width + ROWS * i;
                part[at..at + ROWS].copy_from_slice(&dot(group, x));
            }
        }
    })
}

/// The 8 rows' dots of one group (all its blocks) with one activation row.
type GroupDot = fn(&[u8], &ActRow) -> [f32; ROWS];

/// The vector kernel where the interleaved form exists (`interleavable`), the scalar one
/// elsewhere.
fn group_kernel() -> GroupDot {
    #[cfg(target_arch = "x86_64")]
    if kernels_available() {
        return x86::dot_group;
    }
    dot_group_scalar
}

/// The reference kernel: the vector one's integer sums per sub-block, in plain Rust.
pub(crate) fn dot_group_scalar(group: &[u8], x: &ActRow) -> [f32; ROWS] {
    let table = crate::quant::f16_table();
    let f16 = |b: &[u8], at: usize| table[u16::from_le_bytes([b[at], b[at + 1]]) as usize];
    let mut out = [0f32; ROWS];
    for (b, gb) in group.chunks_exact(GROUP_BLOCK).enumerate() {
        let step = x.steps[b];
        for (r, o) in out.iter_mut().enumerate() {
            let (mut sums, mut mins) = (0i64, 0i64);
            for s in 0..8 {
                let (mut v, mut res) = (0i64, 0i64);
                for c in 0..4 {
                    for i in 0..4 {
                        let byte = gb[qs_at(s, c, r, i)];
                        for (p, w) in [(8 * c + i, byte & 0x0f), (8 * c + 4 + i, byte >> 4)] {
                            let at = 256 * b + 32 * s + p;
                            v += w as i64 * x.value[at] as i64;
                            if let Some(residual) = x.residual {
                                res += w as i64 * residual[at] as i64;
                            }
                        }
                    }
                }
                let pair = if x.residual.is_some() {
                    256 * v + res
                } else {
                    v
                };
                sums += gb[32 + 8 * s + r] as i64 * pair;
                mins += gb[96 + 8 * s + r] as i64 * x.code_sums[8 * b + s] as i64;
            }
            *o += f16(gb, 2 * r) * step * sums as f32 - f16(gb, 16 + 2 * r) * step * mins as f32;
        }
    }
    out
}

/// Rows `r0..r1` of an interleaved `[n, k]` Q4_K matrix as f32 into `out` (`(r1 - r0) · k`),
/// straight from the group-blocks (`d · scale · q − dmin · min`, as ggml dequantizes).
pub(crate) fn dequantize_rows(data: &[u8], k: usize, r0: usize, r1: usize, out: &mut [f32]) {
    let nb = k / 256;
    let table = crate::quant::f16_table();
    let f16 = |b: &[u8], at: usize| table[u16::from_le_bytes([b[at], b[at + 1]]) as usize];
    for (r, row) in (r0..r1).zip(out.chunks_exact_mut(k)) {
        let (g, lane) = (r / ROWS, r % ROWS);
        let group = &data[g * nb * GROUP_BLOCK..(g + 1) * nb * GROUP_BLOCK];
        for (gb, values) in group
            .chunks_exact(GROUP_BLOCK)
            .zip(row.chunks_exact_mut(256))
        {
            let (d, dmin) = (f16(gb, 2 * lane), f16(gb, 16 + 2 * lane));
            for (s, sub) in values.chunks_exact_mut(32).enumerate() {
                let scale = d * gb[32 + 8 * s + lane] as f32;
                let offset = dmin * gb[96 + 8 * s + lane] as f32;
                for (c, eight) in sub.chunks_exact_mut(8).enumerate() {
                    let at = qs_at(s, c, lane, 0);
                    let bytes = &gb[at..at + 4];
                    for i in 0..4 {
                        eight[i] = scale * (bytes[i] & 0x0f) as f32 - offset;
                        eight[4 + i] = scale * (bytes[i] >> 4) as f32 - offset;
                    }
                }
            }
        }
    }
}
