//! The `Backend` trait on CUDA: every op is enqueued on the device's one stream (kernels from
//! `kernels/`, GEMMs through cuBLAS); `to_host` and `argmax_to_host` are the sync points.

pub(crate) mod graph;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use infer_core::error::Result;
use infer_core::BackendError;
use infer_core::ProcessGroup;

use crate::device::{elementwise, Device};
use crate::error::{u32_arg, CudaError};
use crate::nccl::NcclComm;
use crate::tensor::{CudaTensor, Storage};
use graph::{StepGraphs, DEFAULT_MAX_CAPTURE};

/// How weight matrices are kept on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaWeights {
    /// Quantized GGUF matrices stay in their blocks where `quant.rs` has kernels for the
    /// type; everything else as `F16` (default).
    Packed,
    /// f16, multiplied on tensor cores with f32 accumulation.
    F16,
    /// f32 (exact dequantized values; the reference path).
    F32,
}

#[derive(Clone)]
pub struct CudaBackend {
    pub(crate) dev: Arc<Device>,
    pub(crate) weights: CudaWeights,
    /// Bytes allocated since the last sync point, and the most any step allocated: the
    /// activations the profiling step needed, which are freed by the time memory is asked.
    step_bytes: Arc<AtomicU64>,
    pub(crate) peak_step_bytes: Arc<AtomicU64>,
    /// The tensor-parallel group's NCCL communicator (`with_group`).
    pub(crate) nccl: Option<Arc<NcclComm>>,
    /// Decode steps recorded as CUDA graphs (`graph.rs`).
    pub(crate) graphs: Arc<StepGraphs>,
}

impl CudaBackend {
    /// Opens device `ordinal`; fails with a clear error (never a panic) without CUDA.
    /// Decode steps of up to `DEFAULT_MAX_CAPTURE` sequences run as CUDA graphs
    /// (`with_cuda_graphs` changes that).
    pub fn new(ordinal: usize, weights: CudaWeights) -> Result<Self> {
        let dev = Device::open(ordinal)?;
        Ok(CudaBackend {
            dev: Arc::new(dev),
            weights,
            step_bytes: Arc::default(),
            peak_step_bytes: Arc::default(),
            nccl: None,
            graphs: Arc::new(StepGraphs::new(DEFAULT_MAX_CAPTURE)),
        })
    }

    /// Records decode steps of up to `max_batch` sequences as CUDA graphs (vLLM's
    /// `--max-cudagraph-capture-size`); 0 runs every step eagerly (`--enforce-eager`).
    pub fn with_cuda_graphs(self, max_batch: usize) -> Self {
        CudaBackend {
            graphs: Arc::new(StepGraphs::new(max_batch)),
            ..self
        }
    }

    /// (decode shapes recorded as CUDA graphs, steps replayed from them) so far.
    pub fn graph_stats(&self) -> (u64, u64) {
        self.graphs.stats()
    }

    /// Joins `group`'s NCCL communicator (every rank together), so `all_reduce_sum` runs
    /// on this device's stream. A missing NCCL is an error naming what to install.
    pub fn with_group(self, group: &dyn ProcessGroup) -> Result<Self> {
        let comm = NcclComm::new(self.dev.stream.clone(), group)?;
        Ok(CudaBackend {
            nccl: Some(Arc::new(comm)),
            ..self
        })
    }

    pub(crate) fn count(&self, bytes: usize) {
        self.step_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn step_done(&self) {
        let step = self.step_bytes.swap(0, Ordering::Relaxed);
        self.peak_step_bytes.fetch_max(step, Ordering::Relaxed);
    }

    pub(crate) fn zeros_f32(&self, n: usize) -> std::result::Result<CudaSlice<f32>, CudaError> {
        self.count(n * 4);
        Ok(self.dev.stream.alloc_zeros::<f32>(n.max(1))?)
    }

    /// An output buffer the op overwrites entirely before anything reads it: no memset.
    pub(crate) fn output_f32(&self, n: usize) -> std::result::Result<CudaSlice<f32>, CudaError> {
        self.count(n * 4);
        // SAFETY: the caller's op writes all `n` elements before they are read; the
        // allocation is stream-ordered on the stream the op runs on.
        Ok(unsafe { self.dev.stream.alloc::<f32>(n.max(1)) }?)
    }

    pub(crate) fn upload_u32(
        &self,
        data: &[u32],
    ) -> std::result::Result<CudaSlice<u32>, CudaError> {
        if data.is_empty() {
            return Ok(self.dev.stream.alloc_zeros::<u32>(1)?);
        }
        Ok(self.dev.stream.clone_htod(data)?)
    }

    /// `out [m, n] = x [m, k] · wᵀ` with `w [n, k]` row-major: in cuBLAS's column-major terms
    /// `outᵀ = w · xᵀ`, i.e. op(A) = Aᵀ on the `[k, n]` column-major view of `w`.
    pub(crate) fn gemm(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
    ) -> std::result::Result<CudaTensor, CudaError> {
        let (m, k) = x.rows_cols();
        let (n, wk) = w.rows_cols();
        if k != wk {
            return Err(BackendError::shape(
                "matmul",
                &[("x", &x.shape), ("w", &w.shape)],
                "x [m, k] · w [n, k]ᵀ",
            )
            .into());
        }
        let mut shape = x.shape.clone();
        if let Some(last) = shape.last_mut() {
            *last = n;
        }
        if m == 0 || n == 0 || k == 0 {
            // Nothing to multiply (k = 0: the zero-filled output is the product).
            return Ok(CudaTensor {
                storage: Storage::F32(self.zeros_f32(m * n)?),
                shape,
            });
        }
        // Few rows (decode): one launch reading each weight once, packed blocks as they are.
        if let Some(kernel) = self.matvec_kernel(w, m) {
            return self.matvec(kernel, x, w, shape);
        }
        // Larger batches: packed matrices as f16 scratch for the tensor cores.
        let dequantized;
        let w_storage = match &w.storage {
            Storage::Packed { .. } => {
                dequantized = self.dequant_f16(w)?;
                &dequantized
            }
            other => other,
        };
        // cuBLAS runs in the thread's current context (kernel launches bind it themselves).
        self.dev.ctx.bind_to_thread()?;
        let xs = x.f32("matmul")?;
        let s = &self.dev.stream;
        // beta = 0: cuBLAS writes every element of the output without reading it.
        let mut out = self.output_f32(m * n)?;
        let dims = |v: usize| {
            i32::try_from(v).map_err(|_| {
                BackendError::too_large("matmul", "a GEMM dimension", v as u64, i32::MAX as u64)
            })
        };
        let (mi, ni, ki) = (dims(m)?, dims(n)?, dims(k)?);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // f16 weights: activations cast to f16 for the tensor cores, accumulation stays f32.
        let mut x_half = None;
        if let Storage::F16(_) = w_storage {
            self.count(m * k * 2);
            // SAFETY: the cast below writes all m*k elements before the GEMM reads them.
            let mut xh = unsafe { s.alloc::<u16>(m * k) }?;
            let len = u32_arg("matmul", m * k)?;
            let mut b = s.launch_builder(self.dev.function("cast_f32_f16")?);
            b.arg(xs).arg(&mut xh).arg(&len);
            // SAFETY: cast_f32_f16(const float*, f16*, u32) over m*k elements; both buffers
            // hold m*k.
            unsafe { b.launch(elementwise(m * k)) }?;
            x_half = Some(xh);
        }
        let ((wp, _w), (xp, _x), dtype, algo) = match (w_storage, &x_half) {
            (Storage::F16(ws), Some(xh)) => (
                ws.device_ptr(s),
                xh.device_ptr(s),
                cudaDataType::CUDA_R_16F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
            ),
            // Plain f32 compute (no TF32): the exact path.
            (Storage::F32(ws), _) => (
                ws.device_ptr(s),
                xs.device_ptr(s),
                cudaDataType::CUDA_R_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            ),
            _ => {
                let what = "f16 weights without f16 activations";
                return Err(BackendError::unsupported("matmul", what).into());
            }
        };
        let (op, _o) = out.device_ptr_mut(s);
        // SAFETY: live device buffers on the handle's stream: w n*k and x m*k of `dtype`,
        // out m*n f32; the leading dimensions (k, k, n) match those row-major shapes.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.dev.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                ni,
                mi,
                ki,
                &alpha as *const f32 as *const _,
                wp as *const _,
                dtype,
                ki,
                xp as *const _,
                dtype,
                ki,
                &beta as *const f32 as *const _,
                op as *mut _,
                cudaDataType::CUDA_R_32F,
                ni,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                algo,
            )
        }?;
        drop((_w, _x, _o));
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape,
        })
    }
}
