//! Q6_K's interleaved layout. One group-block (`GROUP_BLOCK` bytes: block `b` of 8 rows,
//! exactly their 8 blocks' bytes):
//! - `d[8]`: the rows' f16 scales, as stored;
//! - `scales[16][8]`: the signed 8-bit scale of weights `16g..16g+16` of row `r` at `8g + r`;
//! - for each sixteen `g` (weights `16g..16g+16`), 96 bytes: `ql[2][32]`, where for chunk `c`
//!   (weights `8c..8c+8` of the sixteen) byte `4r + i` holds the low four bits of weight
//!   `8c + i` of row `r` in its low nibble and of weight `8c + 4 + i` in its high one; then
//!   `qh[32]`, where byte `4r + i` holds the top two bits of weights `i`, `4 + i`, `8 + i`
//!   and `12 + i`, at bits 0-1, 2-3, 4-5 and 6-7. The kernels read them in order: with the
//!   top bits in a region of their own (as stored), two interleaved streams jumping at every
//!   block left the loads waiting on memory (the kernel ran at half the row-major one's
//!   speed).
//!
//! Codes are 0..=63 around 32: the kernels sum codes against activations and subtract 32
//! times the activations' per-16 sums (`ActRow::value_sums`), each scaled.

#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

use super::{f16_at, ActRow, Kind, ROWS};

pub(crate) struct Q6K;

pub(super) const D: usize = 0;
pub(super) const SCALES: usize = 16;
const SIXTEENS: usize = 144;

/// Low-nibble byte of weight `8c + i` (and high nibble of `8c + 4 + i`) of sixteen `g`, row `r`.
pub(super) fn ql_at(g: usize, c: usize, r: usize, i: usize) -> usize {
    SIXTEENS + 96 * g + 32 * c + 4 * r + i
}

/// The byte holding the top bits of weights `i + 4t` (t = 0..4) of sixteen `g`, row `r`.
pub(super) fn qh_at(g: usize, r: usize, i: usize) -> usize {
    SIXTEENS + 96 * g + 64 + 4 * r + i
}

/// Where weight `l` (0..256) of a stored Q6_K block keeps its bits: (`ql` byte, shift of its
/// nibble, `qh` byte, shift of its top two bits), as ggml's `dequantize_row_q6_K` reads them.
#[expect(clippy::cast_possible_truncation, reason = "quarter < 4")]
fn stored_at(l: usize) -> (usize, u32, usize, u32) {
    let (half, j) = (l / 128, l % 128);
    let (quarter, t) = (j / 32, j % 32);
    (
        64 * half + t + 32 * (quarter % 2),
        4 * (quarter as u32 / 2),
        128 + 32 * half + t,
        2 * quarter as u32,
    )
}

fn code_of(block: &[u8], l: usize) -> u8 {
    let (ql, ql_shift, qh, qh_shift) = stored_at(l);
    ((block[ql] >> ql_shift) & 0x0f) | (((block[qh] >> qh_shift) & 3) << 4)
}

/// Code `l` (0..256) of row `r` in a group-block.
fn interleaved_code(gb: &[u8], r: usize, l: usize) -> u8 {
    let (g, w) = (l / 16, l % 16);
    let (c, rest) = (w / 8, w % 8);
    let (i, high) = (rest % 4, rest / 4);
    let low = (gb[ql_at(g, c, r, i)] >> (4 * high)) & 0x0f;
    let top = (gb[qh_at(g, r, i)] >> (2 * (w / 4))) & 3;
    low | (top << 4)
}

impl Kind for Q6K {
    const WEIGHTS: usize = 256;
    const BLOCK: usize = 210;
    const GROUP_BLOCK: usize = 8 * 210;

    fn pack_block(block: &[u8], r: usize, gb: &mut [u8]) {
        gb[D + 2 * r..D + 2 * r + 2].copy_from_slice(&block[208..210]);
        let mut codes = [0u8; 256];
        for (l, code) in codes.iter_mut().enumerate() {
            *code = code_of(block, l);
        }
        for (g, sixteen) in codes.chunks_exact(16).enumerate() {
            gb[SCALES + 8 * g + r] = block[192 + g];
            for i in 0..4 {
                let [a, b, c, d] = [sixteen[i], sixteen[4 + i], sixteen[8 + i], sixteen[12 + i]];
                gb[ql_at(g, 0, r, i)] = (a & 0x0f) | ((b & 0x0f) << 4);
                gb[ql_at(g, 1, r, i)] = (c & 0x0f) | ((d & 0x0f) << 4);
                gb[qh_at(g, r, i)] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((d >> 4) << 6);
            }
        }
    }

    #[cfg(test)]
    fn unpack_block(gb: &[u8], r: usize, block: &mut [u8]) {
        block[..208].fill(0);
        block[208..210].copy_from_slice(&gb[D + 2 * r..D + 2 * r + 2]);
        for g in 0..16 {
            block[192 + g] = gb[SCALES + 8 * g + r];
        }
        for l in 0..256 {
            let code = interleaved_code(gb, r, l);
            let (ql, ql_shift, qh, qh_shift) = stored_at(l);
            block[ql] |= (code & 0x0f) << ql_shift;
            block[qh] |= (code >> 4) << qh_shift;
        }
    }

    fn dequantize(gb: &[u8], r: usize, out: &mut [f32]) {
        let d = f16_at(gb, D + 2 * r);
        for (g, sixteen) in out.chunks_exact_mut(16).enumerate() {
            let scale = d * gb[SCALES + 8 * g + r] as i8 as f32;
            for i in 0..4 {
                let (lo, hi) = (gb[ql_at(g, 0, r, i)], gb[ql_at(g, 1, r, i)]);
                let top = gb[qh_at(g, r, i)];
                let low = [lo & 0x0f, lo >> 4, hi & 0x0f, hi >> 4];
                for (t, low) in low.into_iter().enumerate() {
                    let code = low | (((top >> (2 * t)) & 3) << 4);
                    sixteen[4 * t + i] = scale * (code as i32 - 32) as f32;
                }
            }
        }
    }

    fn dot_scalar(group: &[u8], x: &ActRow) -> [f32; ROWS] {
        let mut out = [0f32; ROWS];
        for (b, gb) in group.chunks_exact(Self::GROUP_BLOCK).enumerate() {
            let step = x.steps[b];
            for (r, o) in out.iter_mut().enumerate() {
                // Per plane: Σ scale · (Σ code · x − 32 · Σ x) over the sixteens.
                let mut planes = [0i64; 2];
                for g in 0..16 {
                    let scale = gb[SCALES + 8 * g + r] as i8 as i64;
                    for (p, (codes, sums)) in [
                        (Some(x.value), Some(x.value_sums)),
                        (x.residual, x.residual_sums),
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        let (Some(codes), Some(sums)) = (codes, sums) else {
                            continue;
                        };
                        let dot: i64 = (0..16)
                            .map(|w| {
                                interleaved_code(gb, r, 16 * g + w) as i64
                                    * codes[256 * b + 16 * g + w] as i64
                            })
                            .sum();
                        planes[p] += scale * (dot - 32 * sums[16 * b + g] as i64);
                    }
                }
                let total = if x.residual.is_some() {
                    256 * planes[0] + planes[1]
                } else {
                    planes[0]
                };
                *o += f16_at(gb, D + 2 * r) * step * total as f32;
            }
        }
        out
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn dot_x86<V: super::x86::Lanes, const PAIRED: bool, const R: usize>(
        groups: super::x86::Blocks,
        nb: usize,
        xs: &[&ActRow; R],
    ) -> [[f32; 16]; R] {
        // SAFETY: forwarded.
        unsafe { x86::q6k_dot::<V, PAIRED, R>(groups, nb, xs) }
    }
}
