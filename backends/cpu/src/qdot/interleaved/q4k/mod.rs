//! Q4_K's interleaved layout. One group-block (`GROUP_BLOCK` bytes: block `b` of 8 rows):
//! - `d[8]`, `dmin[8]`: the rows' f16 super-block scales, as stored;
//! - `scales[8][8]`, `mins[8][8]`: sub-block `s`'s 6-bit scale and min of row `r` at `8s + r`,
//!   decoded from the 12 packed bytes;
//! - `qs[8][4][32]`: for sub-block `s` and chunk `c` (its weights `8c..8c+8`), byte `4r + i`
//!   holds weight `8c + i` of row `r` in its low nibble and weight `8c + 4 + i` in its high one.

#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

use infer_core::gguf::kquants::scale_min_k4;

use super::{f16_at, ActRow, Kind, ROWS};

pub(crate) struct Q4K;

/// Weight `i` (0..256) of a Q4_K block's `qs`: byte `32 (i / 64) + i % 32`, low nibble for
/// the first 32 of each 64.
#[cfg(test)]
fn nibble_at(i: usize) -> (usize, u32) {
    (32 * (i / 64) + i % 32, if i % 64 < 32 { 0 } else { 4 })
}

/// Where weight `8c + i` (low nibble) and `8c + 4 + i` (high) of sub-block `s` of row `r` go.
pub(super) fn qs_at(s: usize, c: usize, r: usize, i: usize) -> usize {
    160 + 128 * s + 32 * c + 4 * r + i
}

/// Offsets of the fields in a group-block.
pub(super) const D: usize = 0;
pub(super) const DMIN: usize = 16;
pub(super) const SCALES: usize = 32;
pub(super) const MINS: usize = 96;

impl Kind for Q4K {
    const WEIGHTS: usize = 256;
    const BLOCK: usize = 144;
    const GROUP_BLOCK: usize = 16 + 16 + 64 + 64 + 1024;

    #[expect(clippy::cast_possible_truncation, reason = "6-bit scales and mins")]
    fn pack_block(block: &[u8], r: usize, gb: &mut [u8]) {
        gb[D + 2 * r..D + 2 * r + 2].copy_from_slice(&block[0..2]);
        gb[DMIN + 2 * r..DMIN + 2 * r + 2].copy_from_slice(&block[2..4]);
        for s in 0..8 {
            let (sc, mn) = scale_min_k4(s, &block[4..16]);
            gb[SCALES + 8 * s + r] = sc as u8;
            gb[MINS + 8 * s + r] = mn as u8;
        }
        // The 256 codes in order: each 32 bytes of `qs` hold 32 codes in their low nibbles and
        // the next 32 in their high ones.
        let mut codes = [0u8; 256];
        for (sixty_four, bytes) in codes
            .chunks_exact_mut(64)
            .zip(block[16..144].chunks_exact(32))
        {
            for (l, &byte) in bytes.iter().enumerate() {
                sixty_four[l] = byte & 0x0f;
                sixty_four[32 + l] = byte >> 4;
            }
        }
        for s in 0..8 {
            for c in 0..4 {
                for i in 0..4 {
                    let at = 32 * s + 8 * c + i;
                    gb[qs_at(s, c, r, i)] = codes[at] | (codes[at + 4] << 4);
                }
            }
        }
    }

    #[cfg(test)]
    fn unpack_block(gb: &[u8], r: usize, block: &mut [u8]) {
        block[0..2].copy_from_slice(&gb[D + 2 * r..D + 2 * r + 2]);
        block[2..4].copy_from_slice(&gb[DMIN + 2 * r..DMIN + 2 * r + 2]);
        // The 12 bytes `scale_min_k4` reads: scales and mins 0..4 in the low six bits of
        // bytes 0..4 and 4..8, 4..8 as nibbles of bytes 8..12 with their top two bits above
        // 0..8.
        let scales = &mut block[4..16];
        scales.fill(0);
        for s in 0..8 {
            let (sc, mn) = (gb[SCALES + 8 * s + r], gb[MINS + 8 * s + r]);
            if s < 4 {
                scales[s] |= sc & 63;
                scales[s + 4] |= mn & 63;
            } else {
                scales[s + 4] = (sc & 0x0f) | ((mn & 0x0f) << 4);
                scales[s - 4] |= (sc >> 4) << 6;
                scales[s] |= (mn >> 4) << 6;
            }
        }
        let qs = &mut block[16..144];
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

    fn dequantize(gb: &[u8], r: usize, out: &mut [f32]) {
        let (d, dmin) = (f16_at(gb, D + 2 * r), f16_at(gb, DMIN + 2 * r));
        for (s, sub) in out.chunks_exact_mut(32).enumerate() {
            let scale = d * gb[SCALES + 8 * s + r] as f32;
            let offset = dmin * gb[MINS + 8 * s + r] as f32;
            for (c, eight) in sub.chunks_exact_mut(8).enumerate() {
                let at = qs_at(s, c, r, 0);
                for (i, &byte) in gb[at..at + 4].iter().enumerate() {
                    eight[i] = scale * (byte & 0x0f) as f32 - offset;
                    eight[4 + i] = scale * (byte >> 4) as f32 - offset;
                }
            }
        }
    }

    fn dot_scalar(group: &[u8], x: &ActRow) -> [f32; ROWS] {
        let mut out = [0f32; ROWS];
        for (b, gb) in group.chunks_exact(Self::GROUP_BLOCK).enumerate() {
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
                    sums += gb[SCALES + 8 * s + r] as i64 * pair;
                    mins += gb[MINS + 8 * s + r] as i64 * x.sums32[8 * b + s] as i64;
                }
                let (d, dmin) = (f16_at(gb, D + 2 * r), f16_at(gb, DMIN + 2 * r));
                *o += d * step * sums as f32 - dmin * step * mins as f32;
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
        unsafe { x86::q4k_dot::<V, PAIRED, R>(groups, nb, xs) }
    }
}
