//! GGML tensor types we can load, their block layouts, and dequantization to f32.
//! Layouts follow ggml-common.h: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL blocks pack 32 weights with an
//! f16 scale (and min), MXFP4's 32 share a power-of-two exponent; K-quants and IQ4_XS (see
//! `kquants`) pack 256.

use half::{bf16, f16};
use rayon::prelude::*;

use super::kquants::{self, QK_K};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    IQ4NL,
    IQ4XS,
    BF16,
    /// OCP microscaling FP4 (gpt-oss experts): 32 E2M1 values sharing a power-of-two scale.
    MXFP4,
}

const QK: usize = 32;

impl GgmlType {
    /// Every quantized type we read, in ggml's id order.
    pub const QUANTIZED: [GgmlType; 13] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
        GgmlType::MXFP4,
    ];

    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            20 => GgmlType::IQ4NL,
            23 => GgmlType::IQ4XS,
            30 => GgmlType::BF16,
            39 => GgmlType::MXFP4,
            _ => return None,
        })
    }

    /// Whether values are packed in blocks with scales (every type but F32, F16 and BF16).
    pub fn is_quantized(self) -> bool {
        !matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    /// ggml's name for the type, as `llama-quantize` and model cards spell it.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::IQ4NL => "IQ4_NL",
            GgmlType::IQ4XS => "IQ4_XS",
            GgmlType::MXFP4 => "MXFP4",
        }
    }

    /// (elements per block, bytes per block)
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (QK, 2 + QK / 2),
            GgmlType::Q4_1 => (QK, 4 + QK / 2),
            GgmlType::Q5_0 => (QK, 6 + QK / 2),
            GgmlType::Q5_1 => (QK, 8 + QK / 2),
            GgmlType::IQ4NL => (QK, 2 + QK / 2),
            GgmlType::MXFP4 => (QK, 1 + QK / 2),
            GgmlType::IQ4XS => (QK_K, 136),
            GgmlType::Q8_0 => (QK, 2 + QK),
            GgmlType::Q2K => (QK_K, 84),
            GgmlType::Q3K => (QK_K, 110),
            GgmlType::Q4K => (QK_K, 144),
            GgmlType::Q5K => (QK_K, 176),
            GgmlType::Q6K => (QK_K, 210),
        }
    }

    /// Bytes of one row of `row_len` elements (a whole number of blocks).
    pub fn row_bytes(self, row_len: usize) -> usize {
        let (per_block, bytes) = self.block();
        row_len / per_block * bytes
    }

    /// Bytes of a tensor of `n_elems` whose rows have `row_len` elements; `None` when rows do not
    /// split into whole blocks.
    pub fn num_bytes(self, n_elems: usize, row_len: usize) -> Option<usize> {
        let (per_block, bytes) = self.block();
        if !row_len.is_multiple_of(per_block) {
            return None;
        }
        (n_elems / per_block).checked_mul(bytes)
    }

    /// Dequantizes `raw` (exactly `num_bytes` long) into `out`.
    pub fn dequantize(self, raw: &[u8], out: &mut [f32]) {
        let (per_block, bytes) = self.block();
        debug_assert_eq!(raw.len() / bytes * per_block, out.len());
        // Chunks of many blocks keep rayon's overhead negligible.
        let blocks_per_task = 1024;
        raw.par_chunks(bytes * blocks_per_task)
            .zip(out.par_chunks_mut(per_block * blocks_per_task))
            .for_each(|(src, dst)| {
                for (b, o) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(per_block)) {
                    self.dequantize_block(b, o);
                }
            });
    }

    fn dequantize_block(self, b: &[u8], o: &mut [f32]) {
        let h = |i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        match self {
            GgmlType::F32 => o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            GgmlType::F16 => o[0] = h(0),
            GgmlType::BF16 => o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            GgmlType::Q8_0 => {
                let d = h(0);
                for (x, q) in o.iter_mut().zip(&b[2..]) {
                    *x = (*q as i8) as f32 * d;
                }
            }
            GgmlType::Q4_0 => {
                let d = h(0);
                for (j, q) in b[2..].iter().enumerate() {
                    o[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
                    o[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
            GgmlType::Q4_1 => {
                let (d, m) = (h(0), h(2));
                for (j, q) in b[4..].iter().enumerate() {
                    o[j] = (q & 0x0f) as f32 * d + m;
                    o[j + QK / 2] = (q >> 4) as f32 * d + m;
                }
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                // Each weight's fifth bit sits in the 32-bit `qh`; Q5_0 codes are centred on 16.
                let (d, m, at) = if self == GgmlType::Q5_1 {
                    (h(0), h(2), 4)
                } else {
                    (h(0), -16.0 * h(0), 2)
                };
                let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                for (j, q) in b[at + 4..].iter().enumerate() {
                    let lo = (q & 0x0f) as u32 | (((qh >> j) & 1) << 4);
                    let hi = (q >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
                    o[j] = lo as f32 * d + m;
                    o[j + QK / 2] = hi as f32 * d + m;
                }
            }
            GgmlType::IQ4NL => {
                let d = h(0);
                for (j, q) in b[2..].iter().enumerate() {
                    o[j] = d * kquants::IQ4_VALUES[(q & 0x0f) as usize] as f32;
                    o[j + QK / 2] = d * kquants::IQ4_VALUES[(q >> 4) as usize] as f32;
                }
            }
            GgmlType::MXFP4 => {
                let d = kquants::e8m0_half(b[0]);
                for (j, q) in b[1..].iter().enumerate() {
                    o[j] = d * kquants::MXFP4_VALUES[(q & 0x0f) as usize] as f32;
                    o[j + QK / 2] = d * kquants::MXFP4_VALUES[(q >> 4) as usize] as f32;
                }
            }
            GgmlType::IQ4XS => kquants::iq4_xs(b, o),
            GgmlType::Q2K => kquants::q2_k(b, o),
            GgmlType::Q3K => kquants::q3_k(b, o),
            GgmlType::Q4K => kquants::q4_k(b, o),
            GgmlType::Q5K => kquants::q5_k(b, o),
            GgmlType::Q6K => kquants::q6_k(b, o),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_1_block_matches_formula() {
        let mut raw = Vec::new();
        raw.extend(f16b(0.5));
        raw.extend(f16b(-1.0));
        raw.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0f32; 32];
        GgmlType::Q4_1.dequantize(&raw, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 0.5 - 1.0);
            assert_eq!(out[j + 16], (15 - j) as f32 * 0.5 - 1.0);
        }
    }

    #[test]
    fn q4_0_and_q8_0_blocks_match_formula() {
        let mut raw = Vec::new();
        raw.extend(f16b(2.0));
        raw.extend((0..16u8).map(|j| j | (j << 4)));
        let mut out = [0f32; 32];
        GgmlType::Q4_0.dequantize(&raw, &mut out);
        assert_eq!(out[0], -16.0);
        assert_eq!(out[31], 14.0);

        let mut raw = Vec::new();
        raw.extend(f16b(0.25));
        raw.extend((0..32).map(|j: i32| (j - 16) as i8 as u8));
        GgmlType::Q8_0.dequantize(&raw, &mut out);
        assert_eq!(out[0], -4.0);
        assert_eq!(out[31], 3.75);
    }

    #[test]
    fn row_length_must_fill_blocks() {
        assert_eq!(GgmlType::Q4_1.num_bytes(64, 64), Some(40));
        assert_eq!(GgmlType::Q4_1.num_bytes(48, 48), None);
        assert_eq!(GgmlType::BF16.num_bytes(3, 3), Some(6));
    }
}
