//! Weight matrices kept in their GGUF blocks on the device (`kernels/quant.cu`): a Q4_K_M
//! model takes about its file's size and decode reads 3-4x fewer bytes than from f16. Small
//! batches (decode) multiply the blocks directly in one matvec launch; larger ones dequantize
//! the matrix to f16 in front of cuBLAS's tensor-core GEMM, where compute, not bytes, bounds
//! the step.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use infer_core::gguf::GgmlType;
use infer_core::weights::PackedTensor;

use crate::backend::{u32_arg, CudaBackend, CudaWeights};
use crate::device::elementwise;
use crate::error::{op_err, CudaError};
use crate::tensor::{CudaTensor, Storage};

/// Rows of activations one matvec launch takes (`MATVEC_MAX_ROWS` in quant.cu); above it the
/// step is large enough for tensor cores.
pub const MATVEC_MAX_ROWS: usize = 8;

/// Warps in a matvec block, and the weight rows each takes (`MATVEC_ROWS_PER_WARP`).
const MATVEC_WARPS: u32 = 4;
const MATVEC_ROWS_PER_WARP: u32 = 2;

/// The kernels of a quant type the device computes on.
pub struct QuantKernels {
    pub matvec: &'static str,
    pub dequant: &'static str,
    pub embedding: &'static str,
}

/// `dtype`'s kernels (static names: no formatting on the per-step path), or `None` (the
/// loader then dequantizes that matrix to f16).
pub fn kernels_for(dtype: GgmlType) -> Option<QuantKernels> {
    macro_rules! names {
        ($s:literal) => {
            QuantKernels {
                matvec: concat!("matvec_", $s),
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

    /// The matvec kernel for `w` when `x` has few enough rows and `w`'s rows are whole
    /// 32-weight units: packed types, and f16 (one launch instead of a cast and a GEMM).
    pub(crate) fn matvec_kernel(&self, w: &CudaTensor, m: usize) -> Option<&'static str> {
        let (_, k) = w.rows_cols();
        if m > MATVEC_MAX_ROWS || !k.is_multiple_of(32) {
            return None;
        }
        match &w.storage {
            Storage::F16(_) => Some("matvec_f16"),
            Storage::Packed { dtype, .. } => kernels_for(*dtype).map(|k| k.matvec),
            Storage::F32(_) => None,
        }
    }

    /// `out [m, n] = x [m, k] · wᵀ` by `kernel` (from `matvec_kernel`).
    pub(crate) fn matvec(
        &self,
        kernel: &str,
        x: &CudaTensor,
        w: &CudaTensor,
        out_shape: Vec<usize>,
    ) -> Result<CudaTensor, CudaError> {
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
        match &w.storage {
            Storage::F16(d) => b.arg(d),
            Storage::Packed { data, .. } => b.arg(data),
            Storage::F32(_) => return Err(op_err("matmul", "no matvec for f32 weights")),
        };
        b.arg(x.f32("matmul")?)
            .arg(&mut out)
            .arg(&n32)
            .arg(&k32)
            .arg(&m32);
        let cfg = LaunchConfig {
            grid_dim: (n32.div_ceil(MATVEC_WARPS * MATVEC_ROWS_PER_WARP), 1, 1),
            block_dim: (32 * MATVEC_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matvec_*(const u8* w, const float* x, float* y, u32 rows, u32 cols, u32 m):
        // w holds n rows of k weights in its type's blocks (checked at upload; k a multiple
        // of 32), x m*k f32, out m*n; m <= MATVEC_MAX_ROWS; each warp's first row is below
        // n, and it stores only rows below n.
        unsafe { b.launch(cfg) }?;
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: out_shape,
        })
    }

    /// A packed matrix as f16 (a step's scratch), for the tensor-core GEMM.
    pub(crate) fn dequant_f16(&self, w: &CudaTensor) -> Result<Storage, CudaError> {
        let Storage::Packed { dtype, data } = &w.storage else {
            return Err(op_err("matmul", "dequantizing a tensor that is not packed"));
        };
        let kernels = kernels_for(*dtype)
            .ok_or_else(|| op_err("matmul", format!("no kernels for {}", dtype.name())))?;
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
            return Err(op_err("embedding", "table is not packed"));
        };
        let kernels = kernels_for(*dtype)
            .ok_or_else(|| op_err("embedding", format!("no kernels for {}", dtype.name())))?;
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
