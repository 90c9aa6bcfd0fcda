//! Matmul on block-quantized weights (GGUF Q4_0 / Q4_1 / Q8_0 / MXFP4) kept as stored, in f32 math
//! (measured faster than the integer path of `qdot` for these types, and exact in f32). Each 32-weight
//! block is `d * code (+ m)`; the dot product is computed per block as
//! `d * Σ code·x + m * Σ x` in f32, which equals the dot with the dequantized weights up to f32
//! rounding while reading 4-6x fewer bytes per token than f32 weights.

use infer_core::gguf::GgmlType;

use crate::blocked::{self, Weights};
use crate::isa::Isa;
use crate::matmul::{gemm_into, SMALL_M};
use crate::scale_table::f16_table;
use crate::tiles::{by_column_tiles, prefetch_ahead, streaming_tile};

const QK: usize = 32;

#[inline(always)]
fn scale(table: &[f32], b: &[u8], at: usize) -> f32 {
    table[u16::from_le_bytes([b[at], b[at + 1]]) as usize]
}

/// A block layout: bytes per 32-weight block and how to read it. A weight is
/// `d * code + m` (Q4_1) or `d * code` (Q4_0, Q8_0; `m` = 0).
trait Block {
    const BYTES: usize;
    const HAS_MIN: bool;
    /// The 32 integer codes as f32, and (d, m).
    fn codes(table: &[f32], b: &[u8], out: &mut [f32; QK]) -> (f32, f32);
}

struct Q4_0;
impl Block for Q4_0 {
    const BYTES: usize = 2 + QK / 2;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn codes(table: &[f32], b: &[u8], out: &mut [f32; QK]) -> (f32, f32) {
        for j in 0..QK / 2 {
            let q = b[2 + j];
            out[j] = ((q & 0x0f) as i32 - 8) as f32;
            out[j + QK / 2] = ((q >> 4) as i32 - 8) as f32;
        }
        (scale(table, b, 0), 0.0)
    }
}

struct Q4_1;
impl Block for Q4_1 {
    const BYTES: usize = 4 + QK / 2;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn codes(table: &[f32], b: &[u8], out: &mut [f32; QK]) -> (f32, f32) {
        for j in 0..QK / 2 {
            let q = b[4 + j];
            out[j] = (q & 0x0f) as f32;
            out[j + QK / 2] = (q >> 4) as f32;
        }
        (scale(table, b, 0), scale(table, b, 2))
    }
}

struct Q8_0;
impl Block for Q8_0 {
    const BYTES: usize = 2 + QK;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn codes(table: &[f32], b: &[u8], out: &mut [f32; QK]) -> (f32, f32) {
        for j in 0..QK {
            out[j] = (b[2 + j] as i8) as f32;
        }
        (scale(table, b, 0), 0.0)
    }
}

/// gpt-oss's experts: E2M1 codes (doubled, `kvalues_mxfp4`) under a halved E8M0 scale.
struct Mxfp4;
impl Block for Mxfp4 {
    const BYTES: usize = 1 + QK / 2;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn codes(_: &[f32], b: &[u8], out: &mut [f32; QK]) -> (f32, f32) {
        use infer_core::gguf::kquants::{e8m0_half, MXFP4_VALUES};
        for j in 0..QK / 2 {
            let q = b[1 + j];
            out[j] = MXFP4_VALUES[(q & 0x0f) as usize] as f32;
            out[j + QK / 2] = MXFP4_VALUES[(q >> 4) as usize] as f32;
        }
        (e8m0_half(b[0]), 0.0)
    }
}

/// `out[i] = dot(x row i, w row)` for the `M` input rows, per block as
/// `d * Σ code·x + m * Σ x` (`x_sums` holds Σ x per row and block): the codes are converted
/// once and shared by all rows, and each row costs three FMAs per 16 lanes. `M` is a constant
/// so the accumulators stay in vector registers.
#[inline(always)]
fn dot_rows<B: Block, const M: usize>(
    w_row: &[u8],
    x: &[f32],
    x_sums: &[f32],
    k: usize,
    out: &mut [f32],
) {
    const H: usize = QK / 2;
    let blocks = k / QK;
    let mut acc = [[0f32; H]; M];
    let mut acc_min = [0f32; M];
    let mut q = [0f32; QK];
    let table = f16_table();
    for (blk, b) in w_row.chunks_exact(B::BYTES).enumerate() {
        let (d, m) = B::codes(table, b, &mut q);
        for (i, a) in acc.iter_mut().enumerate() {
            let xs = &x[i * k + blk * QK..][..QK];
            let mut t = [0f32; H];
            for l in 0..H {
                t[l] = q[l] * xs[l];
            }
            for l in 0..H {
                t[l] = q[H + l].mul_add(xs[H + l], t[l]);
            }
            for l in 0..H {
                a[l] = d.mul_add(t[l], a[l]);
            }
            if B::HAS_MIN {
                acc_min[i] = m.mul_add(x_sums[i * blocks + blk], acc_min[i]);
            }
        }
    }
    for ((o, a), am) in out.iter_mut().zip(&acc).zip(acc_min) {
        *o = a.iter().sum::<f32>() + am;
    }
}

/// Picks the kernel for `out.len()` rows (1..=SMALL_M) and the vector width of `isa`.
fn dot_rows_dispatch<B: Block>(
    isa: Isa,
    w_row: &[u8],
    x: &[f32],
    x_sums: &[f32],
    k: usize,
    out: &mut [f32],
) {
    macro_rules! by_rows {
        ($kernel:ident) => {
            match out.len() {
                1 => $kernel::<B, 1>(w_row, x, x_sums, k, out),
                2 => $kernel::<B, 2>(w_row, x, x_sums, k, out),
                3 => $kernel::<B, 3>(w_row, x, x_sums, k, out),
                4 => $kernel::<B, 4>(w_row, x, x_sums, k, out),
                5 => $kernel::<B, 5>(w_row, x, x_sums, k, out),
                6 => $kernel::<B, 6>(w_row, x, x_sums, k, out),
                7 => $kernel::<B, 7>(w_row, x, x_sums, k, out),
                _ => $kernel::<B, SMALL_M>(w_row, x, x_sums, k, out),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    {
        if isa.has_avx512() {
            // SAFETY: the level has AVX-512F, and this CPU runs it (`Isa::current` and
            // `Isa::available` give only such levels).
            return unsafe { by_rows!(dot_rows_avx512) };
        }
        if isa.has_avx2() {
            // SAFETY: the level has AVX2 and FMA, and this CPU runs it.
            return unsafe { by_rows!(dot_rows_avx2) };
        }
    }
    let _ = isa;
    by_rows!(dot_rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn dot_rows_avx512<B: Block, const M: usize>(
    w_row: &[u8],
    x: &[f32],
    x_sums: &[f32],
    k: usize,
    out: &mut [f32],
) {
    dot_rows::<B, M>(w_row, x, x_sums, k, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_rows_avx2<B: Block, const M: usize>(
    w_row: &[u8],
    x: &[f32],
    x_sums: &[f32],
    k: usize,
    out: &mut [f32],
) {
    dot_rows::<B, M>(w_row, x, x_sums, k, out)
}

/// `w = d * code + m` for every weight of whole blocks.
#[inline(always)]
fn dequantize_blocks<B: Block>(w: &[u8], out: &mut [f32]) {
    let table = f16_table();
    let mut q = [0f32; QK];
    for (b, o) in w.chunks_exact(B::BYTES).zip(out.chunks_exact_mut(QK)) {
        let (d, m) = B::codes(table, b, &mut q);
        for l in 0..QK {
            o[l] = q[l].mul_add(d, m);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn dequantize_blocks_avx512<B: Block>(w: &[u8], out: &mut [f32]) {
    dequantize_blocks::<B>(w, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dequantize_blocks_avx2<B: Block>(w: &[u8], out: &mut [f32]) {
    dequantize_blocks::<B>(w, out)
}

fn dequantize_dispatch<B: Block>(w: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::Isa::current().has_avx512() {
            // SAFETY: the level in use has AVX-512F, and this CPU runs it (`Isa::current`).
            return unsafe { dequantize_blocks_avx512::<B>(w, out) };
        }
        if crate::isa::Isa::current().has_avx2() {
            // SAFETY: the level in use has AVX2 and FMA, and this CPU runs it (`Isa::current`).
            return unsafe { dequantize_blocks_avx2::<B>(w, out) };
        }
    }
    dequantize_blocks::<B>(w, out)
}

/// Decodes a tile of packed rows to f32: vectorized for Q4_0 / Q4_1 / Q8_0 / MXFP4, the generic
/// GGUF decoder for other block types.
fn dequantize_tile(dtype: GgmlType, w: &[u8], out: &mut [f32]) {
    match dtype {
        GgmlType::Q4_0 => dequantize_dispatch::<Q4_0>(w, out),
        GgmlType::Q4_1 => dequantize_dispatch::<Q4_1>(w, out),
        GgmlType::Q8_0 => dequantize_dispatch::<Q8_0>(w, out),
        GgmlType::MXFP4 => dequantize_dispatch::<Mxfp4>(w, out),
        _ => dtype.dequantize(w, out),
    }
}

/// Whether `matmul_packed` has kernels for `dtype` (the others go to `qdot`).
pub fn has_f32_kernels(dtype: GgmlType) -> bool {
    matches!(
        dtype,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::MXFP4
    )
}

/// `out [m, n] = x [m, k] · wᵀ` for a packed `w [n, k]` (`k` a multiple of 32).
pub fn matmul_packed(
    x: &[f32],
    w: &[u8],
    dtype: GgmlType,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    matmul_packed_on(Isa::current(), x, w, dtype, m, k, n)
}

/// `matmul_packed` on the blocked and row kernels of `isa` (tests pick each level).
fn matmul_packed_on(
    isa: Isa,
    x: &[f32],
    w: &[u8],
    dtype: GgmlType,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let row_bytes = dtype.row_bytes(k);
    debug_assert_eq!(w.len(), n * row_bytes);
    if m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    let weights = Weights::Packed(w, dtype);
    if blocked::supports_at(isa, weights, m, k) {
        return blocked::matmul_at(isa, x, weights, m, k, n);
    }
    // Few rows stream each weight row once through a block kernel (Q4_0/Q4_1/Q8_0); otherwise
    // each tile is decoded to f32 once and GEMM reuses it across rows (any block type).
    let streamed = m <= SMALL_M && has_f32_kernels(dtype);
    // Σ x per row and block, for the `m * Σ x` term of Q4_1.
    let x_sums: Vec<f32> = if streamed && dtype == GgmlType::Q4_1 {
        x.chunks_exact(QK).map(|c| c.iter().sum()).collect()
    } else {
        Vec::new()
    };
    let tile = if streamed { streaming_tile(n) } else { 64 };
    by_column_tiles(m, n, tile, |c0, c1, part| {
        let w_tile = &w[c0 * row_bytes..c1 * row_bytes];
        let width = c1 - c0;
        if streamed {
            let mut col = [0f32; SMALL_M];
            let col = &mut col[..m];
            for (j, w_row) in w_tile.chunks_exact(row_bytes).enumerate() {
                prefetch_ahead(w_tile, j, row_bytes);
                match dtype {
                    GgmlType::Q4_0 => dot_rows_dispatch::<Q4_0>(isa, w_row, x, &x_sums, k, col),
                    GgmlType::Q4_1 => dot_rows_dispatch::<Q4_1>(isa, w_row, x, &x_sums, k, col),
                    GgmlType::MXFP4 => dot_rows_dispatch::<Mxfp4>(isa, w_row, x, &x_sums, k, col),
                    // `streamed` admits only these four types.
                    _ => dot_rows_dispatch::<Q8_0>(isa, w_row, x, &x_sums, k, col),
                }
                for (i, v) in col.iter().enumerate() {
                    part[i * width + j] = *v;
                }
            }
        } else {
            // A per-thread buffer: a fresh zeroed tile per call cost a memset as large as the
            // tile itself.
            thread_local! {
                static TILE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
            }
            TILE.with_borrow_mut(|w_f32| {
                w_f32.resize(width * k, 0.0);
                dequantize_tile(dtype, w_tile, w_f32);
                gemm_into(x, w_f32, m, k, width, part, false);
            });
        }
    })
}

/// Rows `rows` of a packed `[n, k]` matrix, as f32 (embedding lookup).
pub fn gather_rows_packed(w: &[u8], dtype: GgmlType, k: usize, rows: &[u32]) -> Vec<f32> {
    let row_bytes = dtype.row_bytes(k);
    let mut out = vec![0f32; rows.len() * k];
    for (o, &r) in out.chunks_exact_mut(k).zip(rows) {
        dtype.dequantize(&w[r as usize * row_bytes..(r as usize + 1) * row_bytes], o);
    }
    out
}

#[cfg(test)]
mod tests;
