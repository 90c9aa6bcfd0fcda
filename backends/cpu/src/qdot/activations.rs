//! Activation rows quantized once per matmul to 8 bits in groups that share a scale:
//! `x ≈ scale * code`, `code` in -127..=127 so `maddubs` pairs never saturate.
//!
//! Two group sizes (`group_of`): 16 for the 32-weight block types (llama.cpp uses 32; 16 halves
//! how many values share a scale with an outlier channel, which the final hidden state of small
//! models has, SmolLM2: |x| up to 33 beside values near 1, at no cost in their kernels, which
//! apply the scale per 4-weight lane anyway), and 256 for the K-quants, as llama.cpp's Q8_K: one
//! scale per weight block lets their kernels (`fused::kquant`) sum a whole block in integers
//! and convert once, where per-16 scales cost a conversion and two float operations per 32
//! weights. Either way the scales are stored per 4-value lane, so every kernel reads both.

use infer_core::gguf::GgmlType;
use rayon::prelude::*;

use crate::isa::on_level;

pub(crate) struct Q8Rows {
    pub k: usize,
    /// Values per scale: 16, 32 (interleaved 32-weight blocks) or 256.
    pub group: usize,
    /// `m * k` codes.
    pub codes: Vec<i8>,
    /// Eight per 32 values, laid out like `UnpackedRow::scales`: the scale of values 0..16 in
    /// lanes 0..4, of 16..32 in lanes 4..8.
    pub scales: Vec<f32>,
    /// One per 16 values: `scale * Σ code`, for the weights' per-16 offsets.
    pub sums: Vec<f32>,
    /// One per 32 values: the two `sums` of its halves added (for per-32 offsets).
    pub sums32: Vec<f32>,
    /// One per 16 values: `Σ code` (the K-quant kernels' integer offsets).
    pub code_sums: Vec<i16>,
    /// One per group: its scale, packed (the K-quant kernels read one per 256 values, and a
    /// cache line of `scales` per block would add a quarter to the codes' footprint in L1).
    pub group_scales: Vec<f32>,
}

/// One activation row as the kernels read it.
#[derive(Clone, Copy)]
pub(crate) struct XRow<'a> {
    pub codes: &'a [i8],
    /// Eight per 32 values (see `Q8Rows::scales`).
    pub scales: &'a [f32],
    pub sums: &'a [f32],
    // The x86 fused kernels read these three; elsewhere the unpacked path does not.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub sums32: &'a [f32],
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub code_sums: &'a [i16],
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub group_scales: &'a [f32],
}

impl Q8Rows {
    pub fn row(&self, r: usize) -> XRow<'_> {
        let k = self.k;
        XRow {
            codes: &self.codes[r * k..(r + 1) * k],
            scales: &self.scales[r * k / 4..(r + 1) * k / 4],
            sums: &self.sums[r * k / 16..(r + 1) * k / 16],
            sums32: &self.sums32[r * k / 32..(r + 1) * k / 32],
            code_sums: &self.code_sums[r * k / 16..(r + 1) * k / 16],
            group_scales: &self.group_scales[r * k / self.group..(r + 1) * k / self.group],
        }
    }

    /// Adds the values the codes stand for (`scale * code`) to `out` (`m * k`).
    #[cfg(test)]
    pub fn add_to(&self, out: &mut [f32]) {
        for ((o, c), s) in out
            .chunks_exact_mut(16)
            .zip(self.codes.chunks_exact(16))
            .zip(self.scales.iter().step_by(4))
        {
            for (o, c) in o.iter_mut().zip(c) {
                *o += *c as f32 * s;
            }
        }
    }

    /// The scale of value `p` of a row's scales.
    #[cfg(test)]
    pub fn scale_of(scales: &[f32], p: usize) -> f32 {
        scales[(p / 32) * 8 + (p % 32 / 16) * 4]
    }
}

/// Values per activation scale for matmuls with `dtype` weights: 256 for the types with
/// 256-weight blocks (K-quants, IQ4_XS), 16 for the rest.
pub(crate) fn group_of(dtype: GgmlType) -> usize {
    if dtype.block().0 == 256 {
        256
    } else {
        16
    }
}

/// Quantizes the rows of `x` (`k` a multiple of 32 and of `group`) in groups of `group`
/// values, to nearest, ties to even.
pub(crate) fn quantize_rows(x: &[f32], k: usize, group: usize) -> Q8Rows {
    plane(x.len(), k, group, |band| code_values(x, group, band))
}

/// A group's step (its largest magnitude maps to code 127) and the step's inverse.
#[inline(always)]
fn group_scale(xs: &[f32]) -> (f32, f32) {
    // Eight running maxima by comparison (NaNs skipped, as `f32::max` does): LLVM vectorizes
    // this, where `f32::max`'s NaN rule kept the reduction scalar. Groups hold 16, 32 or 256.
    let mut lanes = [0f32; 8];
    for c in xs.chunks_exact(8) {
        for (l, v) in lanes.iter_mut().zip(c) {
            let a = v.abs();
            if a > *l {
                *l = a;
            }
        }
    }
    let amax = lanes.iter().fold(0f32, |a, &l| if l > a { l } else { a });
    let scale = amax / 127.0;
    (scale, if scale > 0.0 { 1.0 / scale } else { 0.0 })
}

/// `r` to its code: to nearest, ties to even, held to ±127 (so `maddubs` pairs never
/// saturate), NaN (from a broken input) to 0.
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "clamped to ±127")]
fn code_of(r: f32) -> i8 {
    let held = r.round_ties_even().clamp(-127.0, 127.0);
    let held = if held.is_nan() { 0.0 } else { held };
    // SAFETY: `held` is finite and within ±127, so it fits an i32. (The saturating `as`
    // conversion gives the same but LLVM leaves it scalar: a compare and branch per value.)
    unsafe { held.to_int_unchecked::<i32>() as i8 }
}

/// Values per band that one task codes. A decode step's rows (a few thousand values) stay on
/// the calling thread; a prefill's are split over the pool: quantizing them on one thread was
/// 14 % of a 128-token SmolLM2 prefill's samples. A multiple of every group size.
const BAND: usize = 8192;

/// A band of a plane being written: `codes` and `group_scales` by its coder, the rest derived.
struct Band<'a> {
    /// Where the band starts in the plane, in values.
    start: usize,
    codes: &'a mut [i8],
    group_scales: &'a mut [f32],
    scales: &'a mut [f32],
    sums: &'a mut [f32],
    sums32: &'a mut [f32],
    code_sums: &'a mut [i16],
}

/// A plane of `n` values in groups of `group` (`k` a multiple of 32 and of `group`): each band
/// coded by `code` and then what the kernels read derived from it, the bands in parallel when
/// there are several.
fn plane(n: usize, k: usize, group: usize, code: impl Fn(&mut Band) + Sync) -> Q8Rows {
    debug_assert!([16, 32, 256].contains(&group));
    debug_assert!(k.is_multiple_of(32) && k.is_multiple_of(group) && n.is_multiple_of(k));
    let mut q = Q8Rows {
        k,
        group,
        codes: vec![0; n],
        scales: vec![0.0; n / 4],
        sums: vec![0.0; n / 16],
        sums32: vec![0.0; n / 32],
        code_sums: vec![0; n / 16],
        group_scales: vec![0.0; n / group],
    };
    let mut bands: Vec<Band> = q
        .codes
        .chunks_mut(BAND)
        .zip(q.group_scales.chunks_mut(BAND / group))
        .zip(q.scales.chunks_mut(BAND / 4))
        .zip(q.sums.chunks_mut(BAND / 16))
        .zip(q.sums32.chunks_mut(BAND / 32))
        .zip(q.code_sums.chunks_mut(BAND / 16))
        .enumerate()
        .map(
            |(i, (((((codes, group_scales), scales), sums), sums32), code_sums))| Band {
                start: i * BAND,
                codes,
                group_scales,
                scales,
                sums,
                sums32,
                code_sums,
            },
        )
        .collect();
    let fill = |band: &mut Band| {
        code(band);
        derive_sums(group, band);
    };
    if let [band] = bands.as_mut_slice() {
        fill(band);
    } else {
        bands.par_iter_mut().for_each(fill);
    }
    q
}

/// A band's scales per 4-value lane and per-16 and per-32 sums, from its codes and steps.
fn derive_sums(group: usize, band: &mut Band<'_>) {
    on_level!((group: usize, band: &mut Band<'_>) -> (), derive(group, band))
}

#[inline(always)]
fn derive(group: usize, band: &mut Band<'_>) {
    for (lanes, &scale) in band
        .scales
        .chunks_exact_mut(group / 4)
        .zip(band.group_scales.iter())
    {
        lanes.fill(scale);
    }
    for (i, ((sum, code_sum), c16)) in band
        .sums
        .iter_mut()
        .zip(band.code_sums.iter_mut())
        .zip(band.codes.chunks_exact(16))
        .enumerate()
    {
        // At most 16 · 127 in magnitude.
        *code_sum = c16.iter().map(|&c| c as i16).sum();
        *sum = band.group_scales[i * 16 / group] * *code_sum as f32;
    }
    for (s32, s) in band.sums32.iter_mut().zip(band.sums.chunks_exact(2)) {
        *s32 = s[0] + s[1];
    }
}

/// A band of the value plane: each group's codes and step.
fn code_values(x: &[f32], group: usize, band: &mut Band<'_>) {
    on_level!((x: &[f32], group: usize, band: &mut Band<'_>) -> (), values(x, group, band))
}

#[inline(always)]
fn values(x: &[f32], group: usize, band: &mut Band<'_>) {
    let x = &x[band.start..band.start + band.codes.len()];
    for ((xs, codes), group_scale_of) in x
        .chunks_exact(group)
        .zip(band.codes.chunks_exact_mut(group))
        .zip(band.group_scales.iter_mut())
    {
        let (scale, inv) = group_scale(xs);
        for (c, v) in codes.iter_mut().zip(xs) {
            *c = code_of(v * inv);
        }
        *group_scale_of = scale;
    }
}

/// What `q` leaves of `x`, quantized again: `x ≈ q + residual` to about 16 bits, for matmuls
/// whose outputs are read directly (the logits) at twice the integer work. The residual of a
/// group is coded in steps of exactly its scale / 256 (`residual_step`), so a kernel may add
/// the two planes' integer sums as `256 · value + residual` before one conversion to float.
pub(crate) fn quantize_residual(x: &[f32], q: &Q8Rows) -> Q8Rows {
    plane(x.len(), q.k, q.group, |band| code_residuals(x, q, band))
}

/// A band of the residual plane: what the value plane `q` leaves of `x`, in its steps.
fn code_residuals(x: &[f32], q: &Q8Rows, band: &mut Band<'_>) {
    on_level!((x: &[f32], q: &Q8Rows, band: &mut Band<'_>) -> (), residuals(x, q, band))
}

#[inline(always)]
fn residuals(x: &[f32], q: &Q8Rows, band: &mut Band<'_>) {
    let group = q.group;
    let range = band.start..band.start + band.codes.len();
    let value_scales = &q.group_scales[range.start / group..range.end / group];
    for (((xs, codes), value_codes), (step_of, &value_scale)) in x[range.clone()]
        .chunks_exact(group)
        .zip(band.codes.chunks_exact_mut(group))
        .zip(q.codes[range].chunks_exact(group))
        .zip(band.group_scales.iter_mut().zip(value_scales))
    {
        let (step, inv) = residual_step(value_scale);
        for ((c, v), vc) in codes.iter_mut().zip(xs).zip(value_codes) {
            *c = code_of((v - *vc as f32 * value_scale) * inv);
        }
        *step_of = step;
    }
}

/// The residual plane's step for a group whose value plane has step `scale`: `scale / 256`
/// (exact: a power of two), and its inverse. The value plane rounds to nearest, so what it
/// leaves is at most half a step: within ±128 residual steps.
#[inline(always)]
fn residual_step(scale: f32) -> (f32, f32) {
    let step = scale / 256.0;
    (step, if step > 0.0 { 1.0 / step } else { 0.0 })
}

/// A residual's code: to nearest, ties to even, held to ±127 (only a residual of more than
/// 127.5 steps, within a step of the half-step bound, is cut) so `maddubs` pairs never
/// saturate.
#[inline(always)]
fn residual_code(r: f32, inv: f32) -> f32 {
    (r * inv).round_ties_even().clamp(-127.0, 127.0)
}

/// In place, every value replaced by what its quantization stands for: `scale * code` of
/// `quantize_rows` in groups of `group`, plus that of `quantize_residual` when `residual`.
/// The same arithmetic in one pass with no codes kept, for the GEMM path, which must see what
/// the integer kernels see.
pub(crate) fn round_trip(x: &mut [f32], residual: bool, group: usize) {
    on_level!(
        (x: &mut [f32], residual: bool, group: usize) -> (),
        round_trip_groups(x, residual, group)
    )
}

#[inline(always)]
fn round_trip_groups(x: &mut [f32], residual: bool, group: usize) {
    debug_assert!([16, 32, 256].contains(&group));
    debug_assert!(x.len().is_multiple_of(group));
    /// One group to `scale * code`, as `quantize` codes it; returns the scale.
    #[inline(always)]
    fn coded(xs: &[f32], out: &mut [f32]) -> f32 {
        let (scale, inv) = group_scale(xs);
        for (o, v) in out.iter_mut().zip(xs) {
            *o = (v * inv).round_ties_even() * scale;
        }
        scale
    }
    let mut q = [0f32; 256];
    for g in x.chunks_exact_mut(group) {
        let q = &mut q[..group];
        let scale = coded(g, q);
        if residual {
            let (step, inv) = residual_step(scale);
            for (q, v) in q.iter_mut().zip(g.iter()) {
                *q += residual_code(v - *q, inv) * step;
            }
        }
        g.copy_from_slice(q);
    }
}
