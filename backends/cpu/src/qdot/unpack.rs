//! Every GGUF quant type decoded to one form the integer kernels share: per weight an 8-bit
//! code, per 16 weights a scale and an offset, `w = scale * code + offset`. Codes are unsigned
//! (0..=63, the offset holds the centre: Q4_0's `-8 d`, Q6_K's `-32 d sc`, K-quant mins) except
//! for Q8_0 and the IQ4 types, whose codes are signed and which have no offset. A row is
//! decoded once per matmul and dotted with every activation row of the step, so batched decode
//! pays the decoding once per weight, not once per row.

use infer_core::gguf::{kquants, GgmlType};

use crate::scale_table::f16_table;

/// How a type's codes are read by the dot kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codes {
    /// 0..=63 (so `maddubs` pairs never saturate), with per-16 offsets.
    Unsigned,
    /// -128..=127 as `i8`, no offsets.
    Signed,
}

pub(crate) fn codes_of(dtype: GgmlType) -> Codes {
    match dtype {
        GgmlType::Q8_0 | GgmlType::IQ4NL | GgmlType::IQ4XS | GgmlType::MXFP4 => Codes::Signed,
        _ => Codes::Unsigned,
    }
}

/// One decoded weight row of `k` weights.
#[derive(Debug, Default)]
pub(crate) struct UnpackedRow {
    /// `k` codes (`i8` bit patterns for `Codes::Signed`).
    pub codes: Vec<u8>,
    /// Eight per 32 weights: the scale of weights 0..16 in lanes 0..4 and of 16..32 in 4..8,
    /// the layout of the kernels' eight 4-weight partial sums.
    pub scales: Vec<f32>,
    /// One per 16 weights (unused for `Codes::Signed`).
    pub offsets: Vec<f32>,
}

struct Out<'a> {
    codes: &'a mut [u8],
    scales: &'a mut [f32],
    offsets: &'a mut [f32],
}

impl Out<'_> {
    /// Scale and offset of the 16-weight group `g` of this block.
    #[inline(always)]
    fn group(&mut self, g: usize, scale: f32, offset: f32) {
        self.scales[(g / 2) * 8 + (g % 2) * 4..][..4].fill(scale);
        if let Some(o) = self.offsets.get_mut(g) {
            *o = offset;
        }
    }

    /// Both groups of the 32-weight chunk `c`.
    #[inline(always)]
    fn chunk(&mut self, c: usize, scale: f32, offset: f32) {
        self.group(2 * c, scale, offset);
        self.group(2 * c + 1, scale, offset);
    }
}

/// Decodes the packed row `w` (whole blocks of `dtype`, `k` weights) into `row`.
#[inline(always)]
pub(crate) fn unpack_row(dtype: GgmlType, w: &[u8], k: usize, row: &mut UnpackedRow) {
    let table = f16_table();
    if row.codes.len() != k {
        row.codes.resize(k, 0);
        row.scales.resize(k / 4, 0.0);
        row.offsets.resize(k / 16, 0.0);
    }
    // One loop per type, each block's decoding inlined into it.
    match dtype {
        GgmlType::Q4_0 => each_block::<Q4_0>(dtype, w, row, table),
        GgmlType::Q4_1 => each_block::<Q4_1>(dtype, w, row, table),
        GgmlType::Q5_0 => each_block::<Q5_0>(dtype, w, row, table),
        GgmlType::Q5_1 => each_block::<Q5_1>(dtype, w, row, table),
        GgmlType::Q8_0 => each_block::<Q8_0>(dtype, w, row, table),
        GgmlType::IQ4NL => each_block::<IQ4NL>(dtype, w, row, table),
        GgmlType::IQ4XS => each_block::<IQ4XS>(dtype, w, row, table),
        GgmlType::MXFP4 => each_block::<MXFP4>(dtype, w, row, table),
        GgmlType::Q2K => each_block::<Q2K>(dtype, w, row, table),
        GgmlType::Q3K => each_block::<Q3K>(dtype, w, row, table),
        GgmlType::Q4K => each_block::<Q4K>(dtype, w, row, table),
        GgmlType::Q5K => each_block::<Q5K>(dtype, w, row, table),
        GgmlType::Q6K => each_block::<Q6K>(dtype, w, row, table),
        // The loader hands only quantized types to the integer path.
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            unreachable!("{} is not a quant type", dtype.name())
        }
    }
}

#[inline(always)]
fn f16_at(table: &[f32], b: &[u8], at: usize) -> f32 {
    table[u16::from_le_bytes([b[at], b[at + 1]]) as usize]
}

/// How one block of a type decodes (a trait, not a closure, so it inlines into the loop).
trait Decode {
    fn decode(table: &[f32], b: &[u8], o: &mut Out);
}

macro_rules! decoder {
    ($name:ident, |$t:ident, $b:ident, $o:ident| $body:block) => {
        struct $name;
        impl Decode for $name {
            #[inline(always)]
            fn decode($t: &[f32], $b: &[u8], $o: &mut Out) $body
        }
    };
}

decoder!(Q4_0, |t, b, o| {
    let d = f16_at(t, b, 0);
    nibbles(&b[2..18], o.codes);
    o.chunk(0, d, -8.0 * d);
});
decoder!(Q4_1, |t, b, o| {
    nibbles(&b[4..20], o.codes);
    o.chunk(0, f16_at(t, b, 0), f16_at(t, b, 2));
});
decoder!(Q5_0, |t, b, o| {
    let d = f16_at(t, b, 0);
    five_bits(&b[2..22], o.codes);
    o.chunk(0, d, -16.0 * d);
});
decoder!(Q5_1, |t, b, o| {
    five_bits(&b[4..24], o.codes);
    o.chunk(0, f16_at(t, b, 0), f16_at(t, b, 2));
});
decoder!(Q8_0, |t, b, o| {
    o.codes.copy_from_slice(&b[2..34]);
    o.chunk(0, f16_at(t, b, 0), 0.0);
});
decoder!(IQ4NL, |t, b, o| {
    iq4_codes(&b[2..18], o.codes);
    o.chunk(0, f16_at(t, b, 0), 0.0);
});
decoder!(MXFP4, |_t, b, o| {
    for j in 0..16 {
        o.codes[j] = kquants::MXFP4_VALUES[(b[1 + j] & 0x0f) as usize] as u8;
        o.codes[j + 16] = kquants::MXFP4_VALUES[(b[1 + j] >> 4) as usize] as u8;
    }
    o.chunk(0, kquants::e8m0_half(b[0]), 0.0);
});
decoder!(IQ4XS, |t, b, o| {
    let d = f16_at(t, b, 0);
    for ib in 0..8 {
        iq4_codes(&b[8 + 16 * ib..24 + 16 * ib], &mut o.codes[32 * ib..]);
        o.chunk(ib, d * kquants::iq4_xs_scale(b, ib) as f32, 0.0);
    }
});
decoder!(Q2K, |t, b, o| {
    q2_k(b, (f16_at(t, b, 80), f16_at(t, b, 82)), o)
});
decoder!(Q3K, |t, b, o| { q3_k(b, f16_at(t, b, 108), o) });
decoder!(Q4K, |t, b, o| {
    q45_k(false, b, (f16_at(t, b, 0), f16_at(t, b, 2)), o)
});
decoder!(Q5K, |t, b, o| {
    q45_k(true, b, (f16_at(t, b, 0), f16_at(t, b, 2)), o)
});
decoder!(Q6K, |t, b, o| { q6_k(b, f16_at(t, b, 208), o) });

/// Decodes every block of the row into the block's slice of the outputs.
#[inline(always)]
fn each_block<D: Decode>(dtype: GgmlType, w: &[u8], row: &mut UnpackedRow, table: &[f32]) {
    let (per_block, bytes) = dtype.block();
    let groups = per_block / 16;
    let offsets = codes_of(dtype) == Codes::Unsigned;
    let blocks = w
        .chunks_exact(bytes)
        .zip(row.codes.chunks_exact_mut(per_block))
        .zip(row.scales.chunks_exact_mut(per_block / 4))
        .zip(row.offsets.chunks_exact_mut(groups));
    for (((b, codes), scales), offs) in blocks {
        let mut o = Out {
            codes,
            scales,
            offsets: if offsets { offs } else { &mut [] },
        };
        D::decode(table, b, &mut o);
    }
}

/// 16 bytes of nibble pairs: low nibbles are weights 0..16, high nibbles 16..32.
#[inline(always)]
fn nibbles(qs: &[u8], out: &mut [u8]) {
    for j in 0..16 {
        out[j] = qs[j] & 0x0f;
        out[j + 16] = qs[j] >> 4;
    }
}

/// Q5_0 / Q5_1: a 32-bit `qh` with each weight's fifth bit, then 16 bytes of nibbles.
#[inline(always)]
fn five_bits(b: &[u8], out: &mut [u8]) {
    let qh = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for j in 0..16 {
        out[j] = (b[4 + j] & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        out[j + 16] = (b[4 + j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
}

#[inline(always)]
fn iq4_codes(qs: &[u8], out: &mut [u8]) {
    for j in 0..16 {
        out[j] = kquants::IQ4_VALUES[(qs[j] & 0x0f) as usize] as u8;
        out[j + 16] = kquants::IQ4_VALUES[(qs[j] >> 4) as usize] as u8;
    }
}

/// Q2_K: 16 groups of 16 two-bit codes, each with a 4-bit scale and 4-bit min.
#[inline(always)]
fn q2_k(b: &[u8], (d, dmin): (f32, f32), o: &mut Out) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let mut g = 0;
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let sc = scales[g];
                for l in 0..16 {
                    o.codes[16 * g + l] = (q[part * 16 + l] >> shift) & 3;
                }
                o.group(g, d * (sc & 0x0f) as f32, -dmin * (sc >> 4) as f32);
                g += 1;
            }
        }
    }
}

/// Q3_K: 16 groups of 16 three-bit codes (centred on 4) with signed 6-bit scales.
#[inline(always)]
fn q3_k(b: &[u8], d: f32, o: &mut Out) {
    let (hmask, qs, packed) = (&b[..32], &b[32..96], &b[96..108]);
    let (mut g, mut m) = (0, 1u8);
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let low = if g < 8 {
                    packed[g] & 0x0f
                } else {
                    packed[g - 8] >> 4
                };
                let high = (packed[8 + g % 4] >> (2 * (g / 4))) & 3;
                let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
                for l in 0..16 {
                    let idx = part * 16 + l;
                    let hbit = if hmask[idx] & m != 0 { 4 } else { 0 };
                    o.codes[16 * g + l] = ((q[idx] >> shift) & 3) | hbit;
                }
                o.group(g, dl, -4.0 * dl);
                g += 1;
            }
            m <<= 1;
        }
    }
}

/// Q4_K / Q5_K: 8 chunks of 32 codes with 6-bit scales and mins (Q5_K adds a fifth bit).
#[inline(always)]
fn q45_k(five_bits: bool, b: &[u8], (d, dmin): (f32, f32), o: &mut Out) {
    let scales = &b[4..16];
    let (qh, qs) = if five_bits {
        (Some(&b[16..48]), &b[48..176])
    } else {
        (None, &b[16..144])
    };
    for j in 0..4 {
        let (lo, hi) = o.codes[64 * j..64 * j + 64].split_at_mut(32);
        for ((l, h), q) in lo
            .iter_mut()
            .zip(hi.iter_mut())
            .zip(&qs[32 * j..32 * j + 32])
        {
            *l = q & 0x0f;
            *h = q >> 4;
        }
        if let Some(qh) = qh {
            for ((l, h), bits) in lo.iter_mut().zip(hi.iter_mut()).zip(qh) {
                *l |= ((bits >> (2 * j)) & 1) << 4;
                *h |= ((bits >> (2 * j + 1)) & 1) << 4;
            }
        }
        for c in [2 * j, 2 * j + 1] {
            let (sc, m) = kquants::scale_min_k4(c, scales);
            o.chunk(c, d * sc, -dmin * m);
        }
    }
}

/// Q6_K: 16 groups of 16 six-bit codes (centred on 32) with signed 8-bit scales.
#[inline(always)]
fn q6_k(b: &[u8], d: f32, o: &mut Out) {
    for n in 0..2 {
        let (ql, qh) = (&b[64 * n..64 * n + 64], &b[128 + 32 * n..160 + 32 * n]);
        let c = &mut o.codes[128 * n..128 * n + 128];
        for l in 0..32 {
            c[l] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
            c[l + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
            c[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            c[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    for g in 0..16 {
        let dl = d * (b[192 + g] as i8) as f32;
        o.group(g, dl, -32.0 * dl);
    }
}
