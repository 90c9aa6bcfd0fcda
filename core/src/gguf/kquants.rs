//! K-quant super-blocks (ggml's Q2_K..Q6_K: 256 weights each, 16 or 32 per sub-block scale) and
//! IQ4_XS, dequantized as ggml's `dequantize_row_*` do. The layouts follow ggml-common.h.

use half::f16;

pub const QK_K: usize = 256;

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// 6-bit scale and min `j` (0..8) packed in the 12 `scales` bytes of Q4_K / Q5_K.
pub fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    let (d, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (d as f32, m as f32)
}

/// Q2_K (84 bytes): scales[16] (4-bit scale, 4-bit min), qs[64] (2 bits), d, dmin.
pub fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (h(b, 80), h(b, 82));
    let (mut is, mut out) = (0, 0);
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0x0f) as f32, dmin * (sc >> 4) as f32);
                for l in 0..16 {
                    y[out] = dl * ((q[part * 16 + l] >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

/// Q3_K (110 bytes): hmask[32] (high bit), qs[64] (low 2 bits), scales[12] (16 × 6-bit), d.
pub fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs, packed) = (&b[..32], &b[32..96], &b[96..108]);
    let d = h(b, 108);
    // Unpack 16 6-bit scales: low 4 bits from bytes 0..8, high 2 bits from bytes 8..12.
    let mut scales = [0i32; 16];
    for (i, s) in scales.iter_mut().enumerate() {
        let low = if i < 8 {
            packed[i] & 0x0f
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = (low | (high << 4)) as i32 - 32;
    }
    let (mut is, mut out, mut m) = (0, 0, 1u8);
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let dl = d * scales[is] as f32;
                is += 1;
                for l in 0..16 {
                    let idx = part * 16 + l;
                    let low = ((q[idx] >> shift) & 3) as i32;
                    let sub = if hmask[idx] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (low - sub) as f32;
                    out += 1;
                }
            }
            m <<= 1;
        }
    }
}

/// Q4_K (144 bytes): d, dmin, scales[12] (8 × 6-bit scale and min), qs[128] (4 bits).
pub fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin, scales, qs) = (h(b, 0), h(b, 2), &b[4..16], &b[16..144]);
    for j in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let q = &qs[32 * j..32 * j + 32];
        for l in 0..32 {
            y[64 * j + l] = d * sc1 * (q[l] & 0x0f) as f32 - dmin * m1;
            y[64 * j + 32 + l] = d * sc2 * (q[l] >> 4) as f32 - dmin * m2;
        }
    }
}

/// Q5_K (176 bytes): like Q4_K plus qh[32] holding each weight's fifth bit.
pub fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin, scales, qh, qs) = (h(b, 0), h(b, 2), &b[4..16], &b[16..48], &b[48..176]);
    for j in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
        let q = &qs[32 * j..32 * j + 32];
        for l in 0..32 {
            let lo = (q[l] & 0x0f) + if qh[l] & u1 != 0 { 16 } else { 0 };
            let hi = (q[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 };
            y[64 * j + l] = d * sc1 * lo as f32 - dmin * m1;
            y[64 * j + 32 + l] = d * sc2 * hi as f32 - dmin * m2;
        }
    }
}

/// Q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (i8), d.
pub fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = h(b, 208);
    for n in 0..2 {
        let (ql, qh, sc) = (
            &b[64 * n..64 * n + 64],
            &b[128 + 32 * n..160 + 32 * n],
            &b[192 + 8 * n..200 + 8 * n],
        );
        let y = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| d * (sc[is + k] as i8) as f32;
            y[l] = s(0) * q1 as f32;
            y[l + 32] = s(2) * q2 as f32;
            y[l + 64] = s(4) * q3 as f32;
            y[l + 96] = s(6) * q4 as f32;
        }
    }
}

/// The 16 non-uniform levels of IQ4_NL / IQ4_XS (ggml's `kvalues_iq4nl`).
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4's E2M1 levels, doubled so they are integers (ggml's `kvalues_mxfp4`); the block's
/// scale is halved to match (`e8m0_half`).
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of the E8M0 scale `2^(e - 127)`, exact for every byte (ggml's `e8m0_to_fp32_half`).
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// The 6-bit scale of IQ4_XS sub-block `ib` (0..8), centred on 32.
pub fn iq4_xs_scale(b: &[u8], ib: usize) -> i32 {
    let high = u16::from_le_bytes([b[2], b[3]]);
    let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
    (low as i32 | ((((high >> (2 * ib)) & 3) as i32) << 4)) - 32
}

/// IQ4_XS (136 bytes): d, scales_h (u16), scales_l[4], qs[128]: eight 32-weight sub-blocks,
/// each `d * scale * IQ4_VALUES[code]`.
pub fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = h(b, 0);
    for ib in 0..8 {
        let dl = d * iq4_xs_scale(b, ib) as f32;
        let q = &b[8 + 16 * ib..24 + 16 * ib];
        let y = &mut y[32 * ib..32 * ib + 32];
        for j in 0..16 {
            y[j] = dl * IQ4_VALUES[(q[j] & 0x0f) as usize] as f32;
            y[j + 16] = dl * IQ4_VALUES[(q[j] >> 4) as usize] as f32;
        }
    }
}
