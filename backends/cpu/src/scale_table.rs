//! Block scales stored as f16, read through a table.

use std::sync::OnceLock;

use half::f16;

/// Every f16 as f32: one L2-resident load per block scale instead of a conversion call in the
/// innermost loop (`half`'s runtime-dispatched conversion is not inlined there).
pub(crate) fn f16_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_bits(bits).to_f32())
            .collect()
    })
}
