//! Matmul on quantized weights kept as stored (every GGUF quant type we read), or repacked into
//! interleaved groups of 8 rows (`interleaved`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K on
//! x86, which take the integer path at every batch size, bit for bit batch-invariant, but
//! Q8_0's above 64 rows without VNNI).
//!
//! Single-row decode (a few rows more: `integer_max_m`) takes the integer path
//! llama.cpp takes: the activation rows are quantized once to 8 bits (`activations`, one scale
//! per 16 values, or per 256 for the K-quants) and each packed weight row is dotted with every
//! activation row in integer arithmetic: on x86 the common types decode their blocks in
//! registers inside the dot (`fused`, whole K-quant blocks summed in integers); the rest, and other
//! CPUs, decode the row once to codes and scales (`unpack`) for the generic kernels (`kernels`:
//! AVX2, VNNI, NEON with or without `sdot`, picked by `Isa`; the scalar one is the tests'
//! reference). More rows go to
//! f32 kernels (`blocked` for batched decode, GEMM on decoded tiles for prefill) on the
//! activations the integer kernels would see (`Prepared`), so on row-major matrices (other
//! CPUs, types without an interleaved form) results depend on the batch size only through f32
//! rounding.

mod activations;
mod dequantized;
#[cfg(target_arch = "x86_64")]
mod fused;
mod interleaved;
mod kernels;
#[cfg(test)]
mod tests;
mod unpack;

use std::cell::RefCell;

use infer_core::gguf::GgmlType;

use crate::blocked;
use crate::isa::Isa;
use crate::tiles::{by_column_tiles, prefetch_ahead, streaming_tile};
#[cfg(test)]
use activations::XRow;
use activations::{group_of, quantize_residual, quantize_rows, round_trip, Q8Rows};
pub(crate) use dequantized::gather_rows_in;
use dequantized::matmul_dequantized;
pub(crate) use interleaved::{interleavable, interleave, Layout};
use kernels::dot_scalar;
use unpack::{codes_of, unpack_row, Codes, UnpackedRow};

/// Up to this many activation rows take the integer path on CPU levels without blocked kernels
/// (`blocked`). Above it the f32 GEMM's blocking wins (measured with `infer bench latency`, see
/// the README).
pub(crate) const INT_MAX_M: usize = 8;

/// Rows up to which the integer path runs: below the row count from which the register-blocked
/// f32 kernels (`blocked`) beat it on this level; single-row decode always stays integer.
fn integer_max_m() -> usize {
    blocked::faster_than_integer_from().map_or(INT_MAX_M, |from| from - 1)
}

fn isa() -> Isa {
    Isa::current()
}

thread_local! {
    /// Per-thread scratch: a decoded weight row. A fresh one per call costs an allocation and a
    /// memset as large as the data.
    static ROW: RefCell<UnpackedRow> = RefCell::new(UnpackedRow::default());
}

/// `out [m, n] = x [m, k] · wᵀ` for a quantized `w [n, k]` (rows of whole blocks), on the
/// integer path with `activations` up to `integer_max_m()` rows, on f32 kernels above.
pub fn matmul_quantized(
    activations: Activations,
    x: &[f32],
    w: &[u8],
    dtype: GgmlType,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let prepared = Prepared::new(activations, x, m, k, &[(dtype, Layout::Rows)]);
    matmul_prepared(&prepared, w, Layout::Rows, dtype, n)
}

/// Activations `[m, k]` quantized once for any number of matmuls with the same input (QKV,
/// gate/up): once per group size their weight types ask for (`group_of`) and form their
/// layouts take.
pub(crate) struct Prepared<'a> {
    activations: Activations,
    x: &'a [f32],
    m: usize,
    k: usize,
    /// The forms a weight given to `new` needs, by `form_slot`.
    forms: [Option<Form>; 6],
}

enum Form {
    /// The 8-bit planes the integer kernels read: up to `integer_max_m()` rows, and for
    /// interleaved matrices any number (`interleaved::integer_max_m`), so that a row's result
    /// does not depend on its batch at all: the same integer sums meet the same scales in the
    /// same order at every batch size.
    Planes(Vec<Q8Rows>),
    /// More rows: the values those planes stand for, back in f32, for GEMM. A token's result
    /// then does not depend on how many rows share its matmul (up to f32 rounding), so batched
    /// and single requests, and prefix-cache hits, give the same tokens.
    Values(Vec<f32>),
}

impl<'a> Prepared<'a> {
    /// Prepares `x` for matmuls with weights of these types and layouts. Done here, not on
    /// first use inside the matmuls' parallel region: a rayon worker waiting there may run a
    /// sibling matmul that would wait on the same lazy value.
    pub fn new(
        activations: Activations,
        x: &'a [f32],
        m: usize,
        k: usize,
        weights: &[(GgmlType, Layout)],
    ) -> Self {
        debug_assert_eq!(x.len(), m * k);
        let mut prepared = Prepared {
            activations,
            x,
            m,
            k,
            forms: Default::default(),
        };
        for &(dtype, layout) in weights {
            let slot = prepared.form_slot(dtype, layout);
            if prepared.forms[slot].is_none() {
                prepared.forms[slot] = Some(prepared.make(dtype, layout));
            }
        }
        prepared
    }

    /// Whether matmuls with `dtype` in this layout read planes (else values).
    fn planes_for(&self, dtype: GgmlType, layout: Layout) -> bool {
        self.m <= integer_max_m()
            || (layout == Layout::Interleaved && self.m <= interleaved::integer_max_m(dtype, isa()))
    }

    /// Forms by group size (16, 32, 256) and kind (planes, values).
    fn form_slot(&self, dtype: GgmlType, layout: Layout) -> usize {
        let group = match group_for(dtype, layout) {
            16 => 0,
            32 => 1,
            _ => 2,
        };
        2 * group + usize::from(self.planes_for(dtype, layout))
    }

    fn make(&self, dtype: GgmlType, layout: Layout) -> Form {
        let (activations, x, k) = (self.activations, self.x, self.k);
        let group = group_for(dtype, layout);
        if self.planes_for(dtype, layout) {
            Form::Planes(planes_of(activations, x, k, group))
        } else {
            Form::Values(dequantized_activations(activations, x, k, group))
        }
    }
}

/// Values per activation scale for matmuls with `dtype` weights in `layout`: interleaved ones
/// take one step per block.
fn group_for(dtype: GgmlType, layout: Layout) -> usize {
    match layout {
        Layout::Rows => group_of(dtype),
        Layout::Interleaved => interleaved::activation_group(dtype),
    }
}

/// `out [m, n] = x · wᵀ` for prepared activations `x [m, k]` and a quantized `w [n, k]` laid
/// out as `layout` says.
pub(crate) fn matmul_prepared(
    x: &Prepared,
    w: &[u8],
    layout: Layout,
    dtype: GgmlType,
    n: usize,
) -> Vec<f32> {
    let (m, k) = (x.m, x.k);
    let made;
    let form = match &x.forms[x.form_slot(dtype, layout)] {
        Some(form) => form,
        None => {
            made = x.make(dtype, layout);
            &made
        }
    };
    match (form, layout) {
        (Form::Planes(planes), Layout::Rows) => matmul_planes(isa(), planes, w, dtype, m, k, n),
        (Form::Planes(planes), Layout::Interleaved) => {
            interleaved::matmul(dtype, planes, w, m, k, n)
        }
        (Form::Values(values), _) => matmul_dequantized(values, w, layout, dtype, m, k, n),
    }
}

/// `x` quantized as `activations` says, in groups of `group`: one plane, or a plane and its
/// residual.
fn planes_of(activations: Activations, x: &[f32], k: usize, group: usize) -> Vec<Q8Rows> {
    let mut planes = vec![quantize_rows(x, k, group)];
    if activations.residual() {
        planes.push(quantize_residual(x, &planes[0]));
    }
    planes
}

/// The values `planes_of` stands for (its planes added up), in parallel bands of rows: the
/// same numbers, as quantization works on groups within a row.
fn dequantized_activations(
    activations: Activations,
    x: &[f32],
    k: usize,
    group: usize,
) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = x.to_vec();
    out.par_chunks_mut(16 * k)
        .for_each(|band| round_trip(band, activations.residual(), group));
    out
}

/// How finely the integer path quantizes activations (in the weight type's groups,
/// `group_of`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activations {
    /// One 8-bit plane (llama.cpp's choice).
    Int8,
    /// An 8-bit plane and its 8-bit residual (~16 bits): for the logits, where 8-bit
    /// activations move values by tenths and flip greedy picks the f32 path makes.
    Int16,
}

impl Activations {
    fn residual(self) -> bool {
        self == Activations::Int16
    }
}

pub(crate) struct Job<'a> {
    pub dtype: GgmlType,
    pub k: usize,
    pub row_bytes: usize,
    /// The activations, one or two planes that sum to them.
    pub planes: &'a [Q8Rows],
    pub m: usize,
    /// (output row, activation row) for every row of every plane, listed once per matmul.
    #[cfg(target_arch = "x86_64")]
    pub rows: Vec<(usize, activations::XRow<'a>)>,
}

/// The integer path on the kernels of `isa` (tests pick each one).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_integer(
    isa: Isa,
    activations: Activations,
    x: &[f32],
    w: &[u8],
    dtype: GgmlType,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let planes = planes_of(activations, x, k, group_of(dtype));
    matmul_planes(isa, &planes, w, dtype, m, k, n)
}

/// The integer path on activations already quantized to `planes`.
fn matmul_planes(
    isa: Isa,
    planes: &[Q8Rows],
    w: &[u8],
    dtype: GgmlType,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    let row_bytes = dtype.row_bytes(k);
    debug_assert_eq!(w.len(), n * row_bytes);
    if m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    let job = Job {
        dtype,
        k,
        row_bytes,
        planes,
        m,
        #[cfg(target_arch = "x86_64")]
        rows: (0..m)
            .flat_map(|r| planes.iter().map(move |x| (r, x.row(r))))
            .collect(),
    };
    let signed = codes_of(dtype) == Codes::Signed;
    by_column_tiles(m, n, streaming_tile(n), |c0, c1, part| {
        let w_tile = &w[c0 * row_bytes..c1 * row_bytes];
        #[cfg(target_arch = "x86_64")]
        if fused::has_fused(dtype) {
            // SAFETY (every arm): `isa` is supported by this CPU (`Isa::current` and
            // `Isa::available` only give such levels); `w_tile` holds whole rows.
            match isa {
                Isa::Scalar => {}
                Isa::Avx2 | Isa::Avx512 => return unsafe { fused::tile_avx2(&job, w_tile, part) },
                Isa::AvxVnni => return unsafe { fused::tile_avxvnni(&job, w_tile, part) },
                Isa::Avx512Vnni => return unsafe { fused::tile_avx512vnni(&job, w_tile, part) },
            }
        }
        let mut row = ROW.take();
        match (isa, signed) {
            (Isa::Scalar, false) => tile::<ScalarDot, false>(&job, w_tile, part, &mut row),
            (Isa::Scalar, true) => tile::<ScalarDot, true>(&job, w_tile, part, &mut row),
            // SAFETY (every arm): `isa` is supported by this CPU (`Isa::current` and
            // `Isa::available` only give such levels).
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2 | Isa::Avx512, s) => unsafe {
                x86_tiles::avx2(s, &job, w_tile, part, &mut row)
            },
            #[cfg(target_arch = "x86_64")]
            (Isa::AvxVnni, s) => unsafe { x86_tiles::avxvnni(s, &job, w_tile, part, &mut row) },
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512Vnni, s) => unsafe {
                x86_tiles::avx512vnni(s, &job, w_tile, part, &mut row)
            },
            #[cfg(target_arch = "aarch64")]
            (Isa::Neon, s) => unsafe { arm_tiles::neon(s, &job, w_tile, part, &mut row) },
            #[cfg(target_arch = "aarch64")]
            (Isa::NeonDot, s) => unsafe { arm_tiles::neon_dot(s, &job, w_tile, part, &mut row) },
        }
        ROW.set(row);
    })
}

/// A dot kernel over R activation rows (see `kernels`).
trait RowDot {
    /// # Safety
    /// The CPU must have the kernel's features (callers are compiled with them enabled).
    unsafe fn dot<const SIGNED: bool, const R: usize>(
        codes: &[u8],
        scales: &[f32],
        x: &[&[i8]; R],
        xd: &[&[f32]; R],
    ) -> [f32; R];
}

struct ScalarDot;
impl RowDot for ScalarDot {
    #[inline(always)]
    unsafe fn dot<const SIGNED: bool, const R: usize>(
        codes: &[u8],
        scales: &[f32],
        x: &[&[i8]; R],
        xd: &[&[f32]; R],
    ) -> [f32; R] {
        dot_scalar::<SIGNED, R>(codes, scales, x, xd)
    }
}

/// Adds to `part [m, width]` (zeroed) the weight rows of `w_tile` dotted with the activations:
/// each row decoded once, then dotted with the activation rows four at a time.
#[inline(always)]
fn tile<D: RowDot, const SIGNED: bool>(
    job: &Job,
    w_tile: &[u8],
    part: &mut [f32],
    row: &mut UnpackedRow,
) {
    let width = w_tile.len() / job.row_bytes;
    for (j, w_row) in w_tile.chunks_exact(job.row_bytes).enumerate() {
        prefetch_ahead(w_tile, j, job.row_bytes);
        unpack_row(job.dtype, w_row, job.k, row);
        for x in job.planes {
            let mut r = 0;
            while r < job.m {
                let take = (job.m - r).min(4);
                match take {
                    4 => dots::<D, SIGNED, 4>(x, row, r, j, width, part),
                    3 => dots::<D, SIGNED, 3>(x, row, r, j, width, part),
                    2 => dots::<D, SIGNED, 2>(x, row, r, j, width, part),
                    _ => dots::<D, SIGNED, 1>(x, row, r, j, width, part),
                }
                r += take;
            }
            if !SIGNED {
                for r in 0..job.m {
                    part[r * width + j] += offsets_dot(&row.offsets, x.row(r).sums);
                }
            }
        }
    }
}

#[inline(always)]
fn dots<D: RowDot, const SIGNED: bool, const R: usize>(
    x_rows: &Q8Rows,
    row: &UnpackedRow,
    r0: usize,
    j: usize,
    width: usize,
    part: &mut [f32],
) {
    let x: [&[i8]; R] = std::array::from_fn(|i| x_rows.row(r0 + i).codes);
    let xd: [&[f32]; R] = std::array::from_fn(|i| x_rows.row(r0 + i).scales);
    // SAFETY: `tile` is instantiated with a kernel only inside a function compiled with that
    // kernel's features, after `Isa::detect` found them.
    let out = unsafe { D::dot::<SIGNED, R>(&row.codes, &row.scales, &x, &xd) };
    for (i, v) in out.iter().enumerate() {
        part[(r0 + i) * width + j] += *v;
    }
}

/// `Σ offset_g * scale_g * Σ code_g` over the 16-weight groups, in 8 lanes so it vectorizes.
#[inline(always)]
fn offsets_dot(offsets: &[f32], sums: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (o8, s8) = (offsets.chunks_exact(8), sums.chunks_exact(8));
    let tail: f32 = o8
        .remainder()
        .iter()
        .zip(s8.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (o, s) in o8.zip(s8) {
        for l in 0..8 {
            acc[l] = o[l].mul_add(s[l], acc[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// A `RowDot` for a vector kernel of `kernels`, and `tile` compiled with its features (so
/// decoding vectorizes with them too).
macro_rules! isa_tile {
    ($tile:ident, $dot_type:ident, $module:ident::$kernel:ident, $features:literal) => {
        struct $dot_type;
        impl RowDot for $dot_type {
            #[inline(always)]
            unsafe fn dot<const SIGNED: bool, const R: usize>(
                codes: &[u8],
                scales: &[f32],
                x: &[&[i8]; R],
                xd: &[&[f32]; R],
            ) -> [f32; R] {
                // SAFETY: forwarded from the caller (see `RowDot::dot`).
                unsafe { $module::$kernel::<SIGNED, R>(codes, scales, x, xd) }
            }
        }

        /// # Safety
        /// The CPU must have the enabled features.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $tile(
            signed: bool,
            job: &Job,
            w_tile: &[u8],
            part: &mut [f32],
            row: &mut UnpackedRow,
        ) {
            if signed {
                tile::<$dot_type, true>(job, w_tile, part, row)
            } else {
                tile::<$dot_type, false>(job, w_tile, part, row)
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86_tiles {
    use super::*;
    use crate::qdot::kernels::x86;

    isa_tile!(avx2, Avx2Dot, x86::dot_avx2, "avx2,fma");
    isa_tile!(avxvnni, AvxVnniDot, x86::dot_avxvnni, "avx2,fma,avxvnni");
    isa_tile!(
        avx512vnni,
        Avx512VnniDot,
        x86::dot_avx512vnni,
        "avx2,fma,avx512vnni,avx512vl"
    );
}

#[cfg(target_arch = "aarch64")]
mod arm_tiles {
    use super::*;
    use crate::qdot::kernels::arm;

    isa_tile!(neon, NeonDot, arm::dot_neon, "neon");
    isa_tile!(neon_dot, NeonSdot, arm::dot_neon_sdot, "neon,dotprod");
}
