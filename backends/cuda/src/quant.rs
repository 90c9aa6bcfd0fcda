//! Weight matrices kept in their GGUF blocks on the device (`kernels/quant.cu`): a Q4_K_M
//! model takes about its file's size and decode reads 3-4x fewer bytes than from f16. Small
//! batches (decode) multiply the blocks directly: the activations are quantized to q8_1 (8-bit
//! codes per 32, once for all the matrices that share them) and each unit of 32 weights is
//! dotted with `__dp4a`, as llama.cpp's MMVQ kernels do. Larger batches dequantize the matrix
//! to f16 in front of cuBLAS's tensor-core GEMM, where compute, not bytes, bounds the step.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use infer_core::gguf::GgmlType;
use infer_core::weights::PackedTensor;
use infer_core::BackendError;

use crate::backend::{CudaBackend, CudaWeights};
use crate::device::elementwise;
use crate::error::u32_arg;
use crate::error::CudaError;
use crate::tensor::{CudaTensor, Storage};

/// Rows of activations one matvec launch takes (`MATVEC_MAX_ROWS` in quant.cu); above it the
/// step is large enough for tensor cores.
pub const MATVEC_MAX_ROWS: usize = 8;

/// Warps in a matvec block, and the weight rows each takes (`MATVEC_ROWS_PER_WARP`).
const MATVEC_WARPS: u32 = 4;
const MATVEC_ROWS_PER_WARP: u32 = 2;

/// How a decode matvec multiplies: f16 weights on f32 activations, or a packed type's
/// integer kernel on q8_1 activations.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Matvec {
    F16,
    Q8(&'static str),
}

/// Activations as q8_1 runs of 32 (`quantize_q8_1` in quant.cu): eight words of int8 codes
/// and (d, s) per run.
pub(crate) struct Q8Activations {
    q: CudaSlice<u32>,
    ds: CudaSlice<f32>,
    m: usize,
    k: usize,
}

/// A block of `MATVEC_WARPS` warps per `MATVEC_WARPS * MATVEC_ROWS_PER_WARP` weight rows.
fn matvec_config(rows: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(MATVEC_WARPS * MATVEC_ROWS_PER_WARP), 1, 1),
        block_dim: (32 * MATVEC_WARPS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The kernels of a quant type the device computes on.
pub struct QuantKernels {
    /// The decode matvec on q8_1 activations.
    pub matvec_q8: &'static str,
    pub dequant: &'static str,
    pub embedding: &'static str,
}

/// `dtype`'s kernels (static names: no formatting on the per-step path), or `None` (the
/// loader then dequantizes that matrix to f16).
pub fn kernels_for(dtype: GgmlType) -> Option<QuantKernels> {
    macro_rules! names {
        ($s:literal) => {
            QuantKernels {
                matvec_q8: concat!("matvec_q8_", $s),
                dequant: concat!("dequant_", $s),
                embedding: concat!("embedding_", $s),
            }
        };
    }
    Some(match dtype {
        GgmlType::Q8_0 => names!("q8_0"),
        GgmlType::Q4_0 => names!("q4_0"),
        GgmlType::Q4_1 => names!("q4_1"),
        GgmlType::Q4K => names!("q4_k"),
        GgmlType::Q5K => names!("q5_k"),
        GgmlType::Q6K => names!("q6_k"),
        _ => return None,
    })
}

impl CudaBackend {
    /// Keeps `t` packed when the weights mode allows it, the type has kernels and it is one
    /// matrix of whole blocks (expert stacks stay f16: the grouped MoE kernel reads f16).
    pub(crate) fn upload_packed_matrix(
        &self,
        t: &PackedTensor,
    ) -> Result<Option<CudaTensor>, CudaError> {
        if self.weights != CudaWeights::Packed || kernels_for(t.dtype).is_none() {
            return Ok(None);
        }
        let [rows, cols] = t.shape[..] else {
            return Ok(None);
        };
        let (per_block, _) = t.dtype.block();
        if cols == 0 || !cols.is_multiple_of(per_block) || t.data.len() != rows * t.row_bytes() {
            return Ok(None);
        }
        let data = self.dev.stream.clone_htod(&t.data[..])?;
        Ok(Some(CudaTensor {
            storage: Storage::Packed {
                dtype: t.dtype,
                data,
            },
            shape: t.shape.clone(),
        }))
    }

    /// The matvec for `w` when `x` has few enough rows and `w`'s rows are whole 32-weight
    /// units: packed types (on q8_1 activations), and f16 (one launch instead of a cast and a
    /// GEMM).
    pub(crate) fn matvec_kernel(&self, w: &CudaTensor, m: usize) -> Option<Matvec> {
        let (_, k) = w.rows_cols();
        if m > MATVEC_MAX_ROWS || !k.is_multiple_of(32) {
            return None;
        }
        match &w.storage {
            Storage::F16(_) => Some(Matvec::F16),
            Storage::Packed { dtype, .. } => kernels_for(*dtype).map(|k| Matvec::Q8(k.matvec_q8)),
            Storage::F32(_) => None,
        }
    }

    /// `out [m, n] = x [m, k] · wᵀ` by `kernel` (from `matvec_kernel`).
    pub(crate) fn matvec(
        &self,
        kernel: Matvec,
        x: &CudaTensor,
        w: &CudaTensor,
        out_shape: Vec<usize>,
    ) -> Result<CudaTensor, CudaError> {
        let kernel = match kernel {
            Matvec::Q8(kernel) => {
                let xq = self.quantize_q8_1(x)?;
                return self.matvec_q8(kernel, &xq, w, out_shape);
            }
            Matvec::F16 => "matvec_f16",
        };
        let Storage::F16(data) = &w.storage else {
            let what = "the f16 matvec on a matrix that is not f16";
            return Err(BackendError::unsupported("matmul", what).into());
        };
        let (m, k) = x.rows_cols();
        let (n, _) = w.rows_cols();
        let mut out = self.output_f32(m * n)?;
        let (n32, k32, m32) = (
            u32_arg("matmul", n)?,
            u32_arg("matmul", k)?,
            u32_arg("matmul", m)?,
        );
        let s = &self.dev.stream;
        let mut b = s.launch_builder(self.dev.function(kernel)?);
        b.arg(data)
            .arg(x.f32("matmul")?)
            .arg(&mut out)
            .arg(&n32)
            .arg(&k32)
            .arg(&m32);
        // SAFETY: matvec_f16(const u8* w, const float* x, float* y, u32 rows, u32 cols, u32 m):
        // w holds n rows of k halves (k a multiple of 32), x m*k f32, out m*n;
        // m <= MATVEC_MAX_ROWS; each warp's first row is below n, and it stores only rows
        // below n.
        unsafe { b.launch(matvec_config(n32)) }?;
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: out_shape,
        })
    }

    /// `x [m, k]` (k a multiple of 32) as q8_1 runs for the integer matvecs.
    pub(crate) fn quantize_q8_1(&self, x: &CudaTensor) -> Result<Q8Activations, CudaError> {
        let (m, k) = x.rows_cols();
        if !k.is_multiple_of(32) {
            let what = format!("q8_1 activations of {k} columns (a multiple of 32)");
            return Err(BackendError::unsupported("matmul", what).into());
        }
        let runs = m * k / 32;
        self.count(runs * 40);
        let s = &self.dev.stream;
        // SAFETY: quantize_q8_1 below writes every run's eight ints and (d, s).
        let mut q = unsafe { s.alloc::<u32>((runs * 8).max(1)) }?;
        // SAFETY: as above.
        let mut ds = unsafe { s.alloc::<f32>((runs * 2).max(1)) }?;
        let runs32 = u32_arg("matmul", runs)?;
        let mut b = s.launch_builder(self.dev.function("quantize_q8_1")?);
        b.arg(x.f32("matmul")?)
            .arg(&mut q)
            .arg(&mut ds)
            .arg(&runs32);
        // SAFETY: quantize_q8_1(const float* x, int* q, float2* ds, u32 runs), a grid-stride
        // loop over runs: x holds runs * 32 f32, q runs * 8 words, ds runs float2.
        unsafe { b.launch(elementwise(runs)) }?;
        Ok(Q8Activations { q, ds, m, k })
    }

    /// `out [m, n] = x · wᵀ` for a packed `w [n, k]` by its integer matvec `kernel`, on
    /// activations `xq` quantized once for every matrix that takes them.
    pub(crate) fn matvec_q8(
        &self,
        kernel: &str,
        xq: &Q8Activations,
        w: &CudaTensor,
        out_shape: Vec<usize>,
    ) -> Result<CudaTensor, CudaError> {
        let Storage::Packed { data, .. } = &w.storage else {
            let what = "an integer matvec on a matrix that is not packed";
            return Err(BackendError::unsupported("matmul", what).into());
        };
        let (n, k) = w.rows_cols();
        if k != xq.k || xq.m > MATVEC_MAX_ROWS {
            return Err(BackendError::shape(
                "matmul",
                &[("x", &[xq.m, xq.k]), ("w", &w.shape)],
                format!("x [m ≤ {MATVEC_MAX_ROWS}, k] · w [n, k]ᵀ"),
            )
            .into());
        }
        let mut out = self.output_f32(xq.m * n)?;
        let (n32, k32, m32) = (
            u32_arg("matmul", n)?,
            u32_arg("matmul", k)?,
            u32_arg("matmul", xq.m)?,
        );
        let s = &self.dev.stream;
        let mut b = s.launch_builder(self.dev.function(kernel)?);
        b.arg(data)
            .arg(&xq.q)
            .arg(&xq.ds)
            .arg(&mut out)
            .arg(&n32)
            .arg(&k32)
            .arg(&m32);
        // SAFETY: matvec_q8_*(const u8* w, const int* xq, const float2* xds, float* y, u32
        // rows, u32 cols, u32 m): w holds n rows of k weights in its type's blocks (checked at
        // upload; k a multiple of 32), xq m*k/32 runs of codes and scales, out m*n;
        // m <= MATVEC_MAX_ROWS; each warp's first row is below n, and it stores only rows
        // below n.
        unsafe { b.launch(matvec_config(n32)) }?;
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: out_shape,
        })
    }

    /// A packed matrix as f16 (a step's scratch), for the tensor-core GEMM.
    pub(crate) fn dequant_f16(&self, w: &CudaTensor) -> Result<Storage, CudaError> {
        let Storage::Packed { dtype, data } = &w.storage else {
            let what = "dequantizing a tensor that is not packed";
            return Err(BackendError::unsupported("matmul", what).into());
        };
        let kernels = kernels_for(*dtype).ok_or_else(|| {
            BackendError::unsupported("matmul", format!("{} weights", dtype.name()))
        })?;
        let (n, k) = w.rows_cols();
        self.count(n * k * 2);
        // SAFETY: the kernel below writes all n*k halves before the GEMM reads them.
        let mut out = unsafe { self.dev.stream.alloc::<u16>(n * k) }?;
        let (n32, k32) = (u32_arg("matmul", n)?, u32_arg("matmul", k)?);
        let f = self.dev.function(kernels.dequant)?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(data).arg(&mut out).arg(&n32).arg(&k32);
        // SAFETY: dequant_*(const u8* w, f16* out, u32 rows, u32 cols), grid-stride over the
        // n*k/32 units of w's n rows of whole blocks; out holds n*k.
        unsafe { b.launch(elementwise(n * k / 32)) }?;
        Ok(Storage::F16(out))
    }

    /// Rows `ids` of a packed table as f32 (`embedding`), one block per token.
    pub(crate) fn embedding_packed(
        &self,
        table: &CudaTensor,
        ids: &cudarc::driver::CudaSlice<u32>,
        tokens: usize,
        out: &mut cudarc::driver::CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let Storage::Packed { dtype, data } = &table.storage else {
            return Err(
                BackendError::unsupported("embedding", "a table that is not packed").into(),
            );
        };
        let kernels = kernels_for(*dtype).ok_or_else(|| {
            BackendError::unsupported("embedding", format!("{} tables", dtype.name()))
        })?;
        let (_, hidden) = table.rows_cols();
        let h = u32_arg("embedding", hidden)?;
        let f = self.dev.function(kernels.embedding)?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(data).arg(ids).arg(out).arg(&h);
        // SAFETY: embedding_*(const u8* w, const u32* ids, float* out, u32 cols): the caller
        // checked every id against the table's rows; out holds tokens * hidden.
        unsafe { crate::device::launch_rows(&mut b, tokens, 64) }?;
        Ok(())
    }
}
