//! Random quantized matrices: valid blocks of every type (every bit pattern of codes and
//! sub-block scales is one) with small finite f16 scales, for the kernels' tests and
//! `bench`.

use half::f16;
use infer_core::gguf::GgmlType;

/// A 64-bit LCG: the values only need to be varied and repeatable.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// Uniform in [-1, 1].
    pub(crate) fn uniform(&mut self) -> f32 {
        (self.next() % 2_000_001) as f32 / 1_000_000.0 - 1.0
    }
}

/// Byte offsets of the f16 scales in each block (ggml-common.h), as scripts/quant_fixture.py.
fn f16_fields(dtype: GgmlType) -> &'static [usize] {
    match dtype {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        // An E8M0 exponent, set below.
        GgmlType::MXFP4 => &[],
        _ => &[0],
    }
}

/// `[n, k]` of `dtype` (`k` a whole number of blocks) with random codes and small scales.
#[expect(
    clippy::cast_possible_truncation,
    reason = "a random byte: the low 8 bits"
)]
pub(crate) fn random_packed(dtype: GgmlType, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let (per_block, bytes) = dtype.block();
    let mut data: Vec<u8> = (0..n * k / per_block * bytes)
        .map(|_| rng.next() as u8)
        .collect();
    for b in data.chunks_exact_mut(bytes) {
        for &at in f16_fields(dtype) {
            let v = 0.02 * rng.uniform() / per_block as f32 * 32.0;
            b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
        if dtype == GgmlType::MXFP4 {
            // Scales 2^-11 .. 2^-6 (halved, times codes up to 12): values like the others'.
            b[0] = 117 + (rng.next() % 6) as u8;
        }
    }
    data
}
