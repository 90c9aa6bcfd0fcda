//! Register-blocked matmul for batched decode (2 ≤ m ≤ `BLOCKED_MAX_M` rows) on AVX-512 and
//! AVX2: each block of `NR` weight rows is decoded to f32 in registers once and multiplied with
//! `MR` activation rows, accumulating `MR × NR` dot products in vector registers. Weights are
//! read straight from their packed (or f32) rows: nothing is decoded to memory or repacked.
//! Through the `gemm` crate these sizes spent about as long packing and decoding tiles as
//! multiplying (perf, SmolLM2 Q8_0, 32 sequences).

use infer_core::gguf::GgmlType;

use crate::isa::Isa;
use crate::tiles::{by_column_tiles, streaming_tile};

/// Up to this many rows take these kernels; above it `gemm`'s packed GEMM wins (prefill).
pub(crate) const BLOCKED_MAX_M: usize = 64;

/// Weights, rows of `k`, in one of the layouts the kernels read.
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    F32(&'a [f32]),
    Packed(&'a [u8], GgmlType),
}

/// Which kernels run for a level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernels {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "aarch64")]
    Neon,
}

fn kernels_for(isa: Isa) -> Option<Kernels> {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.has_avx512() {
            return Some(Kernels::Avx512);
        }
        if isa.has_avx2() {
            return Some(Kernels::Avx2);
        }
    }
    #[cfg(target_arch = "aarch64")]
    if isa != Isa::Scalar {
        return Some(Kernels::Neon);
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = isa;
    None
}

/// Whether these kernels take this matmul: weights they decode, 2..=`BLOCKED_MAX_M` rows, on
/// a CPU level that has them. One row stays on the streaming kernels; from two rows these are
/// faster (AVX-512, SmolLM2 decode at batch 2 / 4 / 8: Q8_0 +5 / +28 / +55 %, Q4_K_M +13 / +50
/// / +85 % per request, `infer bench latency`).
pub(crate) fn supports(w: Weights, m: usize, k: usize) -> bool {
    supports_at(Isa::current(), w, m, k)
}

pub(crate) fn supports_at(isa: Isa, w: Weights, m: usize, k: usize) -> bool {
    let layout = match w {
        Weights::F32(_) => true,
        Weights::Packed(_, dtype) => {
            matches!(
                dtype,
                GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
            )
        }
    };
    layout && (2..=BLOCKED_MAX_M).contains(&m) && k.is_multiple_of(32) && kernels_for(isa).is_some()
}

/// From how many rows these kernels beat the integer path (`qdot`) on the level in use, for
/// the types that path serves; `None` where the level has no blocked kernels. Measured with
/// `infer bench latency` on SmolLM2's shape, Q4_K: with AVX-512 from 2 rows (per request at
/// batch 2 / 4 / 8: 66 vs 58, 48 vs 32, 32 vs 17 tok/s); with AVX2 from 4 (batch 2: 34 vs
/// 37-46, 4: level, 8: 19-20 vs 15-16, 16: 14 vs 8.2-8.6, the last against `gemm`). NEON is
/// not measured yet and follows AVX2.
pub(crate) fn faster_than_integer_from() -> Option<usize> {
    match kernels_for(Isa::current())? {
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx512 => Some(2),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2 => Some(4),
        #[cfg(target_arch = "aarch64")]
        Kernels::Neon => Some(4),
    }
}

/// `out [m, n] = x [m, k] · wᵀ` in parallel column tiles.
///
/// # Panics
/// If `supports(w, m, k)` is false (callers check it).
pub(crate) fn matmul(x: &[f32], w: Weights, m: usize, k: usize, n: usize) -> Vec<f32> {
    matmul_at(Isa::current(), x, w, m, k, n)
}

/// `matmul` on the kernels of `isa` (tests pick each level).
pub(crate) fn matmul_at(isa: Isa, x: &[f32], w: Weights, m: usize, k: usize, n: usize) -> Vec<f32> {
    assert!(supports_at(isa, w, m, k), "blocked::matmul without kernels");
    by_column_tiles(m, n, streaming_tile(n), |c0, c1, part| {
        let rows = match w {
            Weights::F32(w) => Weights::F32(&w[c0 * k..c1 * k]),
            Weights::Packed(w, dtype) => {
                let row_bytes = dtype.row_bytes(k);
                Weights::Packed(&w[c0 * row_bytes..c1 * row_bytes], dtype)
            }
        };
        into_part_at(isa, x, rows, m, k, part)
    })
}

/// `part [m, rows]` = `x [m, k]` · `rowsᵀ` for the weight rows of one tile.
///
/// # Panics
/// If `supports(rows, m, k)` is false, or the sizes do not match.
pub(crate) fn into_part(x: &[f32], rows: Weights, m: usize, k: usize, part: &mut [f32]) {
    into_part_at(Isa::current(), x, rows, m, k, part)
}

fn into_part_at(isa: Isa, x: &[f32], rows: Weights, m: usize, k: usize, part: &mut [f32]) {
    assert!(
        supports_at(isa, rows, m, k),
        "blocked::into_part without kernels"
    );
    assert_eq!(x.len(), m * k, "blocked: x is not [m, k]");
    /// One level's `tile` on its row readers for each layout.
    macro_rules! by_layout {
        ($level:ident) => {{
            use rows::{BlockRows, F32Rows, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
            use $level::tile;
            // SAFETY (every arm): `supports_at` checked that this CPU runs `isa`, whose
            // kernels these are. Each `Rows` checks that its data holds whole rows of `k`,
            // `tile` that `part` is [m, rows].
            unsafe {
                match rows {
                    Weights::F32(w) => tile(&F32Rows::new(w, k), x, m, k, part),
                    Weights::Packed(w, GgmlType::Q4_0) => {
                        tile(&BlockRows::<Q4_0>::new(w, k), x, m, k, part)
                    }
                    Weights::Packed(w, GgmlType::Q4_1) => {
                        tile(&BlockRows::<Q4_1>::new(w, k), x, m, k, part)
                    }
                    Weights::Packed(w, GgmlType::Q5_0) => {
                        tile(&BlockRows::<Q5_0>::new(w, k), x, m, k, part)
                    }
                    Weights::Packed(w, GgmlType::Q5_1) => {
                        tile(&BlockRows::<Q5_1>::new(w, k), x, m, k, part)
                    }
                    Weights::Packed(w, _) => tile(&BlockRows::<Q8_0>::new(w, k), x, m, k, part),
                }
            }
        }};
    }
    match kernels_for(isa) {
        #[cfg(target_arch = "x86_64")]
        Some(Kernels::Avx512) => by_layout!(avx512),
        #[cfg(target_arch = "x86_64")]
        Some(Kernels::Avx2) => by_layout!(avx2),
        #[cfg(target_arch = "aarch64")]
        Some(Kernels::Neon) => by_layout!(neon),
        None => unreachable!("checked by supports_at"),
    }
}

/// Defines `tile` for one level: fills `part [m, w.len()]`, `MR` activation rows by `NR`
/// weight rows per `kernel` call (each weight block decoded once per call), given the level's
/// target features and the partial row-group sizes below `MR`.
macro_rules! blocked_tile {
    ($features:literal, [$($mr:literal),*]) => {
        /// # Safety
        /// The CPU must have the enabled features.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn tile<W: Rows>(w: &W, x: &[f32], m: usize, k: usize, part: &mut [f32]) {
            let width = w.len();
            assert_eq!(part.len(), m * width, "blocked: part is not [m, rows]");
            macro_rules! by_rows {
                ($nr:tt, $j:expr, $r:expr, $m_rows:expr) => {
                    // SAFETY (every arm): rows $j..$j + $nr and $r..$r + $m_rows exist (the
                    // loops below bound them), and this function runs with the features.
                    unsafe {
                        match $m_rows {
                            $($mr => kernel::<W, $mr, $nr>(w, $j, x, $r, k, part, width),)*
                            _ => kernel::<W, MR, $nr>(w, $j, x, $r, k, part, width),
                        }
                    }
                };
            }
            // Rows outermost: one group's activations (MR × k floats) stay in L1 while the
            // tile's weight rows pass by; columns outermost streamed all m rows from L2 per
            // weight row and ran 20 % slower at 32 rows (AVX-512).
            let mut r = 0;
            while r < m {
                let mr = (m - r).min(MR);
                let mut j = 0;
                while j < width {
                    let nr = (width - j).min(NR);
                    if r == 0 {
                        for c in j..j + nr {
                            w.prefetch(c);
                        }
                    }
                    match nr {
                        1 => by_rows!(1, j, r, mr),
                        2 => by_rows!(2, j, r, mr),
                        _ => by_rows!(NR, j, r, mr),
                    }
                    j += nr;
                }
                r += mr;
            }
        }
    };
}

mod rows;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::hsum;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod decode;
#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(test)]
mod tests;
