//! Quantized matrices repacked at load into groups of 8 rows whose blocks are interleaved
//! byte by byte (llama.cpp's `--repack`, in layouts of our own: `q4k`, `q6k`, and `blocks32`
//! for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0), so that
//! single-row decode handles 8 output rows per register: each 32-byte load holds 4 weights of
//! each of the 8 rows, meets those 4 activations broadcast to every lane, and sums in i16
//! across a sub-block before the sub-block scales (one lane per row) apply once. The
//! row-major kernels (`fused::kquant`) spend a scale multiply-add per 32 weights and row, plus
//! a decode of each block's scales and a horizontal sum per row; here Q4_K's 6-bit scales are
//! decoded at load and the 8 rows' dots come out of one vector. At the 1B shape's 8192 × 2048
//! matrices Q4_K runs at the machine's DRAM rate where the row-major kernel was bound by
//! instructions (see the README). Prefill takes the same kernels (each type decodes a group's
//! weights once for 4 activation rows; the group stays in cache for the rest): they beat GEMM
//! on decoded f32 tiles, and a row's result then does not depend on its batch at all.
//!
//! The repacking is a bijection (`rows_of` gives back the stored bytes exactly: tested), and
//! embedding rows decode straight from it to ggml's values.

mod blocks32;
mod q4k;
mod q6k;
#[cfg(target_arch = "x86_64")]
mod x86;

use infer_core::gguf::GgmlType;
use rayon::prelude::*;

use super::activations::Q8Rows;
use crate::isa::Isa;
use crate::tiles::{by_column_tiles, streaming_tile};

/// Rows per interleaved group.
pub(crate) const ROWS: usize = 8;

/// How a packed matrix's bytes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Rows of whole blocks, as stored in GGUF.
    Rows,
    /// Groups of `ROWS` rows interleaved (this module).
    Interleaved,
}

/// A vector group kernel: the dots of one group (8 rows), or of two side by side, with each of
/// `R` activation rows (each group of weights decoded once for all of them); lanes 0..8 are
/// the first group's rows, 8..16 the second's.
type GroupDots<const R: usize> = fn(&[&[u8]], &[&ActRow; R]) -> [[f32; 16]; R];

/// A level's group kernels for `R` activation rows.
#[derive(Clone, Copy)]
struct Kernels<const R: usize> {
    /// One group at a time (256-bit registers).
    one: GroupDots<R>,
    /// Two groups at a time (512-bit registers), on the AVX-512 levels.
    two: Option<GroupDots<R>>,
}

/// `K`'s vector group kernels at level `isa` for `R` activation rows, where this CPU runs them
/// (x86 only).
fn vector_kernels<K: Kind, const R: usize>(isa: Isa) -> Option<Kernels<R>> {
    #[cfg(target_arch = "x86_64")]
    return x86::kernels::<K, R>(isa);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        None
    }
}

/// A weight type's interleaved layout.
trait Kind {
    /// Weights in a block (256 or 32), and in the activations' quantization groups.
    const WEIGHTS: usize;
    /// Bytes of a stored block.
    const BLOCK: usize;
    /// Bytes of a group-block: the 8 rows' block `b`.
    const GROUP_BLOCK: usize;
    /// Writes row `r`'s stored `block` into the group-block `gb`.
    fn pack_block(block: &[u8], r: usize, gb: &mut [u8]);
    /// Reads row `r`'s block back out of `gb`, as stored.
    #[cfg(test)]
    fn unpack_block(gb: &[u8], r: usize, block: &mut [u8]);
    /// Row `r`'s `WEIGHTS` weights of `gb` as f32, as ggml dequantizes them.
    fn dequantize(gb: &[u8], r: usize, out: &mut [f32]);
    /// The reference group kernel: the vector one's integer sums, in plain Rust.
    fn dot_scalar(group: &[u8], x: &ActRow) -> [f32; ROWS];
    /// The vector group kernel's body on x86 registers `V` (`x86::kernels` compiles it per
    /// level and register width), for one activation plane or two (`PAIRED`), `R` activation
    /// rows and the `V::GROUPS` groups of `nb` blocks starting at `groups`. Implementations are
    /// `#[inline(always)]`: out of line, the body would be compiled without the level's
    /// features and call every intrinsic (20x slower, measured).
    ///
    /// # Safety
    /// `V`'s level's features; `x86::guarded`'s checks passed for the groups and every row,
    /// and every row has a residual plane exactly when `PAIRED`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn dot_x86<V: x86::Lanes, const PAIRED: bool, const R: usize>(
        groups: x86::Blocks,
        nb: usize,
        xs: &[&ActRow; R],
    ) -> [[f32; 16]; R];
}

/// Evaluates `$body` with `$K` naming `$dtype`'s layout (the caller checked
/// `interleavable`).
macro_rules! with_kind {
    ($dtype:expr, $K:ident => $body:expr) => {
        match $dtype {
            GgmlType::Q4K => {
                type $K = q4k::Q4K;
                $body
            }
            GgmlType::Q6K => {
                type $K = q6k::Q6K;
                $body
            }
            GgmlType::Q4_0 => {
                type $K = blocks32::Q4_0;
                $body
            }
            GgmlType::Q4_1 => {
                type $K = blocks32::Q4_1;
                $body
            }
            GgmlType::Q5_0 => {
                type $K = blocks32::Q5_0;
                $body
            }
            GgmlType::Q5_1 => {
                type $K = blocks32::Q5_1;
                $body
            }
            GgmlType::Q8_0 => {
                type $K = blocks32::Q8_0;
                $body
            }
            dtype => unreachable!("{} has no interleaved layout", dtype.name()),
        }
    };
}

/// Whether a `[n, k]` matrix of `dtype` has an interleaved form whose kernels this CPU runs.
pub(crate) fn interleavable(dtype: GgmlType, n: usize, k: usize) -> bool {
    let weights = match dtype {
        GgmlType::Q4K | GgmlType::Q6K => 256,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => 32,
        _ => return false,
    };
    n > 0 && n.is_multiple_of(ROWS) && k > 0 && k.is_multiple_of(weights) && kernels_available()
}

/// Up to how many activation rows an interleaved `dtype` takes the integer kernels on level
/// `isa`: every batch size (a row's result then does not depend on its batch at all), but Q8_0
/// without VNNI above `blocked::BLOCKED_MAX_M` rows. AVX2 multiplies its signed bytes in four
/// instructions (`sign`, `maddubs`, a `madd` to i32 per 4 products, an add) for each of two
/// planes: SmolLM2 Q8_0's 128-token prefill ran at 220-227 tok/s on them against 545-575 on
/// GEMM over f32 tiles (32 requests, AVX2), where its decode gains. So decode batches and
/// logits of up to 64 sequences stay bit for bit invariant there, and prefill-sized matmuls
/// differ from them by f32 rounding.
pub(crate) fn integer_max_m(dtype: GgmlType, isa: Isa) -> usize {
    #[cfg(target_arch = "x86_64")]
    let vnni = matches!(isa, Isa::AvxVnni | Isa::Avx512Vnni);
    #[cfg(not(target_arch = "x86_64"))]
    let vnni = {
        let _ = isa;
        false
    };
    if dtype != GgmlType::Q8_0 || vnni {
        usize::MAX
    } else {
        crate::blocked::BLOCKED_MAX_M
    }
}

/// Values per activation scale for an interleaved matrix of `dtype`: its block's weights, so
/// the kernels apply one activation step per block.
pub(crate) fn activation_group(dtype: GgmlType) -> usize {
    with_kind!(dtype, K => K::WEIGHTS)
}

fn kernels_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::isa::Isa::current().has_avx2() && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The interleaved form of the rows `w` (`[n, k]` of `dtype`, `interleavable`), in parallel
/// over the groups.
pub(crate) fn interleave(dtype: GgmlType, w: &[u8], n: usize, k: usize) -> Vec<u8> {
    with_kind!(dtype, K => interleave_as::<K>(w, n, k))
}

fn interleave_as<K: Kind>(w: &[u8], n: usize, k: usize) -> Vec<u8> {
    let nb = k / K::WEIGHTS;
    let row_bytes = nb * K::BLOCK;
    assert_eq!(w.len(), n * row_bytes, "interleave: not [n, k] rows");
    let mut out = vec![0u8; n / ROWS * nb * K::GROUP_BLOCK];
    out.par_chunks_mut(nb * K::GROUP_BLOCK)
        .zip(w.par_chunks(ROWS * row_bytes))
        .for_each(|(group, rows)| {
            for (b, gb) in group.chunks_exact_mut(K::GROUP_BLOCK).enumerate() {
                for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
                    K::pack_block(&row[b * K::BLOCK..(b + 1) * K::BLOCK], r, gb);
                }
            }
        });
    out
}

/// Group `g` of an interleaved matrix of `nb` blocks per row.
fn group_of<K: Kind>(data: &[u8], nb: usize, g: usize) -> &[u8] {
    &data[g * nb * K::GROUP_BLOCK..(g + 1) * nb * K::GROUP_BLOCK]
}

/// The stored rows `r0..r1` of an interleaved `[n, k]` matrix, into `out` (the tests' proof
/// that the repacking loses nothing).
#[cfg(test)]
pub(crate) fn rows_of(dtype: GgmlType, data: &[u8], k: usize, r0: usize, r1: usize) -> Vec<u8> {
    fn rows_as<K: Kind>(data: &[u8], k: usize, r0: usize, r1: usize) -> Vec<u8> {
        let nb = k / K::WEIGHTS;
        let mut out = vec![0u8; (r1 - r0) * nb * K::BLOCK];
        for (r, row) in (r0..r1).zip(out.chunks_exact_mut(nb * K::BLOCK)) {
            let group = group_of::<K>(data, nb, r / ROWS);
            for (gb, block) in group
                .chunks_exact(K::GROUP_BLOCK)
                .zip(row.chunks_exact_mut(K::BLOCK))
            {
                K::unpack_block(gb, r % ROWS, block);
            }
        }
        out
    }
    with_kind!(dtype, K => rows_as::<K>(data, k, r0, r1))
}

/// Rows `r0..r1` of an interleaved `[n, k]` matrix as f32 into `out` (`(r1 - r0) · k`), as
/// ggml dequantizes them.
pub(crate) fn dequantize_rows(
    dtype: GgmlType,
    data: &[u8],
    k: usize,
    r0: usize,
    r1: usize,
    out: &mut [f32],
) {
    fn rows_as<K: Kind>(data: &[u8], k: usize, r0: usize, r1: usize, out: &mut [f32]) {
        let nb = k / K::WEIGHTS;
        for (r, row) in (r0..r1).zip(out.chunks_exact_mut(k)) {
            let group = group_of::<K>(data, nb, r / ROWS);
            for (gb, values) in group
                .chunks_exact(K::GROUP_BLOCK)
                .zip(row.chunks_exact_mut(K::WEIGHTS))
            {
                K::dequantize(gb, r % ROWS, values);
            }
        }
    }
    with_kind!(dtype, K => rows_as::<K>(data, k, r0, r1, out))
}

/// One activation row as the interleaved kernels read it: one or two planes (a value and its
/// residual, whose step is exactly the value's / 256, `activations::quantize_residual`),
/// quantized in groups of the weights' block (`activation_group`).
pub(crate) struct ActRow<'a> {
    /// Values per step: the weights' `Kind::WEIGHTS`.
    group: usize,
    value: &'a [i8],
    residual: Option<&'a [i8]>,
    /// Per 16 values: each plane's codes summed (Q6_K's centre of 32 meets them).
    value_sums: &'a [i16],
    residual_sums: Option<&'a [i16]>,
    /// Per 32 values: the value codes summed, times 256 plus the residual codes summed where
    /// there is a residual (the sums Q4_K's mins meet).
    sums32: Vec<i32>,
    /// The same in f32 (exact: at most 257 · 32 · 127), for kernels that meet them in f32.
    sums32_f: Vec<f32>,
    /// Per group: the step the integer sums are counted in (the residual's, or the value's
    /// with one plane).
    steps: &'a [f32],
}

impl<'a> ActRow<'a> {
    /// Row `r` of the planes (quantized in groups of one size).
    pub(crate) fn new(planes: &'a [Q8Rows], r: usize) -> Self {
        let group = planes[0].group;
        debug_assert!(planes.iter().all(|p| p.group == group) && (1..=2).contains(&planes.len()));
        let value = planes[0].row(r);
        let residual = planes.get(1).map(|p| p.row(r));
        let sum32 = |s: &[i16]| -> Vec<i32> {
            s.chunks_exact(2)
                .map(|p| p[0] as i32 + p[1] as i32)
                .collect()
        };
        let mut sums32 = sum32(value.code_sums);
        if let Some(res) = &residual {
            for (c, r) in sums32.iter_mut().zip(sum32(res.code_sums)) {
                *c = 256 * *c + r;
            }
        }
        ActRow {
            group,
            value: value.codes,
            residual: residual.map(|r| r.codes),
            value_sums: value.code_sums,
            residual_sums: residual.map(|r| r.code_sums),
            sums32_f: sums32.iter().map(|&s| s as f32).collect(),
            sums32,
            steps: residual.map_or(value.group_scales, |r| r.group_scales),
        }
    }

    /// Whether the row covers `nb` blocks of `weights` in every field the kernels read, in
    /// steps of one per block.
    fn covers(&self, nb: usize, weights: usize) -> bool {
        let values = weights * nb;
        self.group == weights
            && self.value.len() >= values
            && self.residual.is_none_or(|r| r.len() >= values)
            && self.value_sums.len() >= values / 16
            && self.residual_sums.is_none_or(|s| s.len() >= values / 16)
            && self.residual.is_some() == self.residual_sums.is_some()
            && self.sums32.len() >= values / 32
            && self.sums32_f.len() >= values / 32
            && self.steps.len() >= nb
    }
}

/// `out [m, n] = x · wᵀ` for an interleaved `[n, k]` matrix of `dtype` on the activation planes
/// of `m` rows (the integer path).
pub(crate) fn matmul(
    dtype: GgmlType,
    planes: &[Q8Rows],
    data: &[u8],
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    matmul_at(Isa::current(), dtype, planes, data, m, k, n)
}

/// `matmul` on the kernels of level `isa` (tests pick each one).
pub(crate) fn matmul_at(
    isa: Isa,
    dtype: GgmlType,
    planes: &[Q8Rows],
    data: &[u8],
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    with_kind!(dtype, K => matmul_as::<K>(isa, planes, data, m, k, n))
}

fn matmul_as<K: Kind>(
    isa: Isa,
    planes: &[Q8Rows],
    data: &[u8],
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let nb = k / K::WEIGHTS;
    assert_eq!(
        data.len(),
        n / ROWS * nb * K::GROUP_BLOCK,
        "interleaved: not [n, k]"
    );
    let rows: Vec<ActRow> = (0..m).map(|r| ActRow::new(planes, r)).collect();
    assert!(
        rows.iter().all(|x| x.covers(nb, K::WEIGHTS)),
        "interleaved: activations of another width"
    );
    let one = vector_kernels::<K, 1>(isa);
    let four = vector_kernels::<K, 4>(isa);
    // Whole pairs of groups per tile where the level takes two at a time.
    let per_tile = if one.is_some_and(|k| k.two.is_some()) {
        2 * ROWS
    } else {
        ROWS
    };
    let tile = (streaming_tile(n) / per_tile * per_tile).max(per_tile);
    by_column_tiles(m, n, tile, |c0, c1, part| {
        let width = c1 - c0;
        let mut g = c0 / ROWS;
        while g < c1 / ROWS {
            let two = g + 1 < c1 / ROWS;
            let first = group_of::<K>(data, nb, g);
            let pair = [
                first,
                if two {
                    group_of::<K>(data, nb, g + 1)
                } else {
                    first
                },
            ];
            let groups: &[&[u8]] = &pair;
            let at = ROWS * (g - c0 / ROWS);
            let mut put = |r: usize, dots: &[f32; 16], count: usize| {
                let at = r * width + at;
                part[at..at + ROWS * count].copy_from_slice(&dots[..ROWS * count]);
            };
            let mut r = 0;
            match (one, four) {
                (Some(one), Some(four)) => {
                    let (count, groups, one, four) = match (two, one.two, four.two) {
                        (true, Some(one2), Some(four2)) => (2, groups, one2, four2),
                        _ => (1, &groups[..1], one.one, four.one),
                    };
                    while r + 4 <= m {
                        let xs = [&rows[r], &rows[r + 1], &rows[r + 2], &rows[r + 3]];
                        for (j, dots) in four(groups, &xs).iter().enumerate() {
                            put(r + j, dots, count);
                        }
                        r += 4;
                    }
                    for (r, x) in rows.iter().enumerate().skip(r) {
                        put(r, &one(groups, &[x])[0], count);
                    }
                    g += count;
                }
                _ => {
                    for (r, x) in rows.iter().enumerate() {
                        let mut dots = [0f32; 16];
                        dots[..ROWS].copy_from_slice(&K::dot_scalar(groups[0], x));
                        put(r, &dots, 1);
                    }
                    g += 1;
                }
            }
        }
    })
}

/// The f16 at `b[at..at + 2]`.
fn f16_at(b: &[u8], at: usize) -> f32 {
    crate::scale_table::f16_table()[u16::from_le_bytes([b[at], b[at + 1]]) as usize]
}

// After `with_kind`, which the tests use.
#[cfg(test)]
mod tests;
