//! Activation rows quantized once per matmul to 8 bits in 16-wide blocks: `x ≈ scale * code`,
//! `code` in -127..=127 so `maddubs` pairs never saturate. llama.cpp uses 32-wide blocks
//! (256 for K-quants); 16 halves how many values share a block with an outlier channel, which
//! the final hidden state of small models has (SmolLM2: |x| up to 33 beside values near 1),
//! at no cost in the kernels: the scale is applied per 4-weight lane anyway.

pub(crate) struct Q8Rows {
    pub k: usize,
    /// `m * k` codes.
    pub codes: Vec<i8>,
    /// Eight per 32 values, laid out like `UnpackedRow::scales`: the scale of values 0..16 in
    /// lanes 0..4, of 16..32 in lanes 4..8.
    pub scales: Vec<f32>,
    /// One per 16 values: `scale * Σ code`, for the weights' per-16 offsets.
    pub sums: Vec<f32>,
    /// One per 32 values: the two `sums` of its halves added (for per-32 offsets).
    pub sums32: Vec<f32>,
}

/// One activation row as the kernels read it: codes, 8-lane scales, per-16 and per-32 sums.
pub(crate) type XRow<'a> = (&'a [i8], &'a [f32], &'a [f32], &'a [f32]);

impl Q8Rows {
    pub fn row(&self, r: usize) -> XRow<'_> {
        let k = self.k;
        (
            &self.codes[r * k..(r + 1) * k],
            &self.scales[r * k / 4..(r + 1) * k / 4],
            &self.sums[r * k / 16..(r + 1) * k / 16],
            &self.sums32[r * k / 32..(r + 1) * k / 32],
        )
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

/// Quantizes the rows of `x` (`k` a multiple of 32) to nearest, ties to even.
pub(crate) fn quantize_rows(x: &[f32], k: usize) -> Q8Rows {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn quantize_avx2(x: &[f32], k: usize) -> Q8Rows {
        quantize(x, k)
    }
    #[cfg(target_arch = "x86_64")]
    if crate::isa::Isa::current().has_avx2() {
        // SAFETY: the level in use has AVX2 and FMA, and this CPU runs it (`Isa::current`).
        return unsafe { quantize_avx2(x, k) };
    }
    quantize(x, k)
}

/// A 16-value group's step (its largest magnitude maps to code 127) and the step's inverse.
#[inline(always)]
fn group_scale(xs: &[f32]) -> (f32, f32) {
    let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
    let scale = amax / 127.0;
    (scale, if scale > 0.0 { 1.0 / scale } else { 0.0 })
}

#[inline(always)]
fn quantize(x: &[f32], k: usize) -> Q8Rows {
    debug_assert!(k.is_multiple_of(32) && x.len().is_multiple_of(k));
    let mut q = Q8Rows {
        k,
        codes: vec![0; x.len()],
        scales: vec![0.0; x.len() / 4],
        sums: vec![0.0; x.len() / 16],
        sums32: vec![0.0; x.len() / 32],
    };
    for (g, (xs, codes)) in x
        .chunks_exact(16)
        .zip(q.codes.chunks_exact_mut(16))
        .enumerate()
    {
        let (scale, inv) = group_scale(xs);
        for (c, v) in codes.iter_mut().zip(xs) {
            *c = (v * inv).round_ties_even() as i8;
        }
        q.scales[4 * g..4 * g + 4].fill(scale);
        q.sums[g] = scale * codes.iter().map(|&c| c as i32).sum::<i32>() as f32;
    }
    for (s32, s) in q.sums32.iter_mut().zip(q.sums.chunks_exact(2)) {
        *s32 = s[0] + s[1];
    }
    q
}

/// What `q` leaves of `x`, quantized again: `x ≈ q + residual` to about 16 bits, for matmuls
/// whose outputs are read directly (the logits) at twice the integer work.
pub(crate) fn quantize_residual(x: &[f32], q: &Q8Rows) -> Q8Rows {
    let residual: Vec<f32> = x
        .iter()
        .zip(&q.codes)
        .enumerate()
        .map(|(p, (v, c))| v - *c as f32 * q.scales[(p / 16) * 4])
        .collect();
    quantize_rows(&residual, q.k)
}

/// In place, every value replaced by what its quantization stands for: `scale * code` of
/// `quantize_rows`, plus that of `quantize_residual` when `residual`. The same arithmetic in
/// one pass with no codes kept, for the GEMM path, which must see what the integer kernels see.
pub(crate) fn round_trip(x: &mut [f32], residual: bool) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn round_trip_avx2(x: &mut [f32], residual: bool) {
        round_trip_groups(x, residual)
    }
    #[cfg(target_arch = "x86_64")]
    if crate::isa::Isa::current().has_avx2() {
        // SAFETY: the level in use has AVX2 and FMA, and this CPU runs it (`Isa::current`).
        return unsafe { round_trip_avx2(x, residual) };
    }
    round_trip_groups(x, residual)
}

#[inline(always)]
fn round_trip_groups(x: &mut [f32], residual: bool) {
    debug_assert!(x.len().is_multiple_of(16));
    /// One 16-value group to `scale * code`, as `quantize` codes it.
    #[inline(always)]
    fn group(xs: &[f32], out: &mut [f32; 16]) {
        let (scale, inv) = group_scale(xs);
        for (o, v) in out.iter_mut().zip(xs) {
            *o = (v * inv).round_ties_even() * scale;
        }
    }
    for g in x.chunks_exact_mut(16) {
        let mut q = [0f32; 16];
        group(g, &mut q);
        if residual {
            let mut left = [0f32; 16];
            for ((l, v), q) in left.iter_mut().zip(g.iter()).zip(&q) {
                *l = v - q;
            }
            let mut r = [0f32; 16];
            group(&left, &mut r);
            for (q, r) in q.iter_mut().zip(&r) {
                *q += r;
            }
        }
        g.copy_from_slice(&q);
    }
}
