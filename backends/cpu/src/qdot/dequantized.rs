//! The GEMM side of quantized matmuls: more rows than the integer path takes (batched decode,
//! prefill) read the activations' values (`Prepared`) against weights decoded to f32 once per
//! column tile (or the blocked kernels' in-register decoding), and embedding rows are gathered
//! the same way.

use std::cell::RefCell;

use infer_core::gguf::GgmlType;

use super::interleaved::{self, Layout};
use super::unpack::{codes_of, unpack_row, Codes, UnpackedRow};
use super::ROW;
#[cfg(target_arch = "x86_64")]
use super::{fused, isa};
use crate::blocked::{self, Weights};
use crate::matmul::gemm_into;
use crate::tiles::by_column_tiles;

thread_local! {
    /// Per-thread f32 weights for the GEMM path: a fresh tile per call costs an allocation and
    /// a memset as large as the data.
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `w = scale * code + offset` for a decoded row.
#[inline(always)]
fn expand_row(row: &UnpackedRow, signed: bool, out: &mut [f32]) {
    for (c, (codes, o)) in row
        .codes
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(32))
        .enumerate()
    {
        for h in 0..2 {
            let s = row.scales[8 * c + 4 * h];
            let off = if signed { 0.0 } else { row.offsets[2 * c + h] };
            for l in 16 * h..16 * h + 16 {
                let code = if signed {
                    codes[l] as i8 as f32
                } else {
                    codes[l] as f32
                };
                o[l] = s.mul_add(code, off);
            }
        }
    }
}

/// Decodes the packed rows `w` (`k` weights each) to f32.
pub(super) fn dequantize_rows(dtype: GgmlType, w: &[u8], k: usize, out: &mut [f32]) {
    #[inline(always)]
    fn body(dtype: GgmlType, w: &[u8], k: usize, out: &mut [f32]) {
        let row_bytes = dtype.row_bytes(k);
        let signed = codes_of(dtype) == Codes::Signed;
        let mut row = ROW.take();
        for (w_row, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(k)) {
            unpack_row(dtype, w_row, k, &mut row);
            expand_row(&row, signed, o);
        }
        ROW.set(row);
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn body_avx2(dtype: GgmlType, w: &[u8], k: usize, out: &mut [f32]) {
        body(dtype, w, k, out)
    }
    #[cfg(target_arch = "x86_64")]
    if isa().has_avx2() {
        // SAFETY: the level has AVX2 and FMA, and this CPU runs it (`Isa::current`); `w` holds
        // whole rows of `k` weights and `out` room for them (callers' contract).
        return unsafe {
            if fused::has_fused(dtype) {
                fused::dequantize_avx2(dtype, w, k, out)
            } else {
                body_avx2(dtype, w, k, out)
            }
        };
    }
    body(dtype, w, k, out)
}

/// Many rows: column tiles decoded to f32 once and reused by GEMM across the rows.
pub(super) fn matmul_dequantized(
    x: &[f32],
    w: &[u8],
    layout: Layout,
    dtype: GgmlType,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    if layout == Layout::Rows && blocked::supports(Weights::Packed(w, dtype), m, k) {
        return blocked::matmul(x, Weights::Packed(w, dtype), m, k, n);
    }
    by_column_tiles(m, n, 64, |c0, c1, part| {
        let width = c1 - c0;
        let mut w_f32 = TILE.take();
        w_f32.resize(width * k, 0.0);
        decode_rows(w, layout, dtype, k, c0, c1, &mut w_f32);
        if blocked::supports(Weights::F32(&w_f32), m, k) {
            blocked::into_part(x, Weights::F32(&w_f32), m, k, part);
        } else {
            gemm_into(x, &w_f32, m, k, width, part, false);
        }
        TILE.set(w_f32);
    })
}

/// Rows `rows` of a quantized `[n, k]` matrix laid out as `layout` says, as f32 (embedding
/// lookup).
pub(crate) fn gather_rows_in(
    w: &[u8],
    layout: Layout,
    dtype: GgmlType,
    k: usize,
    rows: &[u32],
) -> Vec<f32> {
    let mut out = vec![0f32; rows.len() * k];
    for (o, &r) in out.chunks_exact_mut(k).zip(rows) {
        let r = r as usize;
        decode_rows(w, layout, dtype, k, r, r + 1, o);
    }
    out
}

/// Rows `r0..r1` of `w` (rows of `k` weights laid out as `layout` says) as f32 into `out`.
fn decode_rows(
    w: &[u8],
    layout: Layout,
    dtype: GgmlType,
    k: usize,
    r0: usize,
    r1: usize,
    out: &mut [f32],
) {
    match layout {
        Layout::Rows => {
            let row_bytes = dtype.row_bytes(k);
            dequantize_rows(dtype, &w[r0 * row_bytes..r1 * row_bytes], k, out)
        }
        Layout::Interleaved => interleaved::dequantize_rows(dtype, w, k, r0, r1, out),
    }
}
