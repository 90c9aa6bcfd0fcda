//! Narrowing conversions made on purpose, each with why it cannot lose what matters (the
//! workspace denies `clippy::cast_possible_truncation` everywhere else).

/// An f64 (a config value, an f64 accumulation) in the f32 the kernels compute in: the
/// rounding is the point.
#[expect(
    clippy::cast_possible_truncation,
    reason = "f32 is the compute precision"
)]
pub fn f32_of(x: f64) -> f32 {
    x as f32
}

/// A duration's microseconds or milliseconds for a counter (saturating: 584,000 years).
pub fn u64_saturating(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// An index below a length that was checked to fit 32 bits (a vocabulary within
/// `MAX_VOCAB`, a pool of blocks sized by the engine).
#[expect(clippy::cast_possible_truncation, reason = "callers hold i < 2^32")]
pub fn u32_index(i: usize) -> u32 {
    debug_assert!(u32::try_from(i).is_ok(), "{i} past 32 bits");
    i as u32
}
