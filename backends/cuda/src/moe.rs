//! The routed MLP's ops on CUDA (`kernels/moe.cu`): routing and grouping on the device, the
//! expert-grouped matmul (one launch over every expert, f32 or f16 experts) and the weighted
//! combine. Nothing is read back: the step stays asynchronous.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use infer_core::moe::{HostRouting, MoeRouting, MoeScoring};
use infer_core::BackendError;
use infer_core::Result;

use crate::backend::CudaBackend;
use crate::device::elementwise;
use crate::error::u32_arg;
use crate::error::{cuda_err, CudaError};
use crate::kernels::MOE_MAX_EXPERTS;
use crate::tensor::{CudaTensor, Storage};

/// One layer's routing of a step, in device memory (`HostRouting`'s fields).
pub struct CudaRouting {
    ids: CudaSlice<u32>,
    weights: CudaSlice<f32>,
    offsets: CudaSlice<u32>,
    order: CudaSlice<u32>,
    tokens: usize,
    top_k: usize,
    experts: usize,
}

impl CudaBackend {
    fn alloc_u32(&self, n: usize) -> std::result::Result<CudaSlice<u32>, CudaError> {
        self.count(n * 4);
        // SAFETY: the routing kernels write all `n` elements before anything reads them.
        Ok(unsafe { self.dev.stream.alloc::<u32>(n.max(1)) }?)
    }

    pub(crate) fn route(&self, logits: &CudaTensor, r: &MoeRouting) -> Result<CudaRouting> {
        r.validate()?;
        let (tokens, cols) = logits.rows_cols();
        if cols != r.num_experts || r.num_experts > MOE_MAX_EXPERTS {
            return Err(cuda_err(BackendError::shape(
                "moe_route",
                &[("logits", &logits.shape)],
                format!(
                    "logits [tokens, {} experts], at most {MOE_MAX_EXPERTS} experts",
                    r.num_experts
                ),
            )));
        }
        let assignments = tokens * r.top_k;
        let mut ids = self.alloc_u32(assignments)?;
        let mut weights = self.output_f32(assignments)?;
        let mut offsets = self.alloc_u32(r.num_experts + 1)?;
        let mut order = self.alloc_u32(assignments)?;
        let renormalize = u32::from(!matches!(
            r.scoring,
            MoeScoring::SoftmaxTopK { renormalize: false }
        ));
        let (t32, e32, k32) = (
            u32_arg("moe_route", tokens)?,
            u32_arg("moe_route", r.num_experts)?,
            u32_arg("moe_route", r.top_k)?,
        );
        let a32 = u32_arg("moe_route", assignments)?;
        let s = &self.dev.stream;
        if tokens > 0 {
            let mut b = s.launch_builder(self.dev.function("moe_route")?);
            b.arg(logits.f32("moe_route")?)
                .arg(&mut ids)
                .arg(&mut weights)
                .arg(&t32)
                .arg(&e32)
                .arg(&k32)
                .arg(&renormalize);
            let cfg = LaunchConfig {
                grid_dim: (t32.div_ceil(64), 1, 1),
                block_dim: (64, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: moe_route(const float*, u32*, float*, u32 tokens, u32 experts, u32 top_k,
            // u32) with logits [tokens, experts] and ids/weights of tokens·top_k; one thread
            // per token, the rest return.
            unsafe { b.launch(cfg) }.map_err(CudaError::from)?;
        }
        let mut b = s.launch_builder(self.dev.function("moe_group")?);
        b.arg(&ids)
            .arg(&mut offsets)
            .arg(&mut order)
            .arg(&a32)
            .arg(&e32);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: moe_group(const u32*, u32*, u32*, u32 assignments, u32 experts) with ids and
        // order of `assignments`, offsets of experts + 1 (experts ≤ its shared array, checked
        // above); one block.
        unsafe { b.launch(cfg) }.map_err(CudaError::from)?;
        Ok(CudaRouting {
            ids,
            weights,
            offsets,
            order,
            tokens,
            top_k: r.top_k,
            experts: r.num_experts,
        })
    }

    pub(crate) fn routing_host(&self, r: &CudaRouting) -> Result<HostRouting> {
        let a = r.tokens * r.top_k;
        let s = &self.dev.stream;
        // A read-back inside a CUDA graph's recording would hand back memory nothing wrote.
        let capturing = s.capture_status().map_err(CudaError::from)?;
        if capturing != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            let why = "a read-back while a CUDA graph records";
            return Err(cuda_err(BackendError::unsupported("routing_to_host", why)));
        }
        let read = |b: &CudaSlice<u32>, n: usize| -> Result<Vec<u32>> {
            let mut v = s.clone_dtoh(b).map_err(CudaError::from)?;
            v.truncate(n);
            Ok(v)
        };
        let mut weights = s.clone_dtoh(&r.weights).map_err(CudaError::from)?;
        weights.truncate(a);
        Ok(HostRouting {
            top_k: r.top_k,
            ids: read(&r.ids, a)?,
            weights,
            offsets: read(&r.offsets, r.experts + 1)?,
            order: read(&r.order, a)?,
        })
    }

    pub(crate) fn grouped_matmul(
        &self,
        x: &CudaTensor,
        experts: &CudaTensor,
        r: &CudaRouting,
    ) -> Result<CudaTensor> {
        let (rows, k) = x.rows_cols();
        let assignments = r.tokens * r.top_k;
        let n = match experts.shape.as_slice() {
            [e, n, wk]
                if *e == r.experts && *wk == k && (rows == r.tokens || rows == assignments) =>
            {
                *n
            }
            _ => {
                return Err(cuda_err(BackendError::shape(
                    "moe_matmul",
                    &[("x", &x.shape), ("experts", &experts.shape)],
                    format!(
                        "x [{} tokens or {assignments} assignments, k] · experts [{}, n, k]ᵀ",
                        r.tokens, r.experts
                    ),
                )))
            }
        };
        let mut out = self.output_f32(assignments * n)?;
        let (n32, k32, top32) = (
            u32_arg("moe_matmul", n)?,
            u32_arg("moe_matmul", k)?,
            u32_arg("moe_matmul", r.top_k)?,
        );
        let per_token = u32::from(rows == r.tokens);
        let e32 = u32_arg("moe_matmul", r.experts)?;
        if assignments > 0 && n > 0 {
            let s = &self.dev.stream;
            let kernel = match &experts.storage {
                Storage::F32(_) => "moe_matmul_f32",
                Storage::F16(_) => "moe_matmul_f16",
                // `upload_packed` keeps only 2-D matrices packed; experts are 3-D.
                Storage::Packed { .. } => {
                    let what = "packed expert weights";
                    return Err(cuda_err(BackendError::unsupported("moe_matmul", what)));
                }
            };
            let mut b = s.launch_builder(self.dev.function(kernel)?);
            b.arg(x.f32("moe_matmul")?);
            match &experts.storage {
                Storage::F32(w) => b.arg(w),
                Storage::F16(w) => b.arg(w),
                Storage::Packed { data, .. } => b.arg(data),
            };
            b.arg(&mut out)
                .arg(&r.offsets)
                .arg(&r.order)
                .arg(&n32)
                .arg(&k32)
                .arg(&top32)
                .arg(&per_token);
            let cfg = LaunchConfig {
                grid_dim: (n32.div_ceil(8), e32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: moe_matmul_{f32,f16}(const float* x, const W* w, float* out, const u32*
            // offsets, const u32* order, u32 n, u32 k, u32 top_k, u32 per_token): x holds a row
            // of k per token (or per assignment), w [experts, n, k], out [assignments, n];
            // blockIdx.y < experts indexes offsets of experts + 1; every assignment is in one
            // group, so every output row is written.
            unsafe { b.launch(cfg) }.map_err(CudaError::from)?;
        }
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: vec![assignments, n],
        })
    }

    pub(crate) fn add_expert_bias(
        &self,
        y: &mut CudaTensor,
        bias: &CudaTensor,
        r: &CudaRouting,
    ) -> Result<()> {
        let (rows, cols) = y.rows_cols();
        if rows != r.tokens * r.top_k || bias.shape != [r.experts, cols] {
            return Err(cuda_err(BackendError::shape(
                "moe_add_bias",
                &[("y", &y.shape), ("bias", &bias.shape)],
                format!(
                    "y [{} assignments, n], bias [{} experts, n]",
                    r.tokens * r.top_k,
                    r.experts
                ),
            )));
        }
        let len = rows * cols;
        let (l32, c32) = (
            u32_arg("moe_add_bias", len)?,
            u32_arg("moe_add_bias", cols)?,
        );
        let mut b = self
            .dev
            .stream
            .launch_builder(self.dev.function("moe_add_bias")?);
        b.arg(y.f32_mut("moe_add_bias")?)
            .arg(bias.f32("moe_add_bias")?)
            .arg(&r.ids)
            .arg(&l32)
            .arg(&c32);
        // SAFETY: moe_add_bias(float*, const float*, const u32*, u32 len, u32 cols): y holds
        // len = assignments·cols, ids one expert (< experts, the bias's rows) per assignment.
        unsafe { b.launch(elementwise(len)) }.map_err(CudaError::from)?;
        Ok(())
    }

    pub(crate) fn combine(&self, y: &CudaTensor, r: &CudaRouting) -> Result<CudaTensor> {
        let (rows, cols) = y.rows_cols();
        if rows != r.tokens * r.top_k {
            return Err(cuda_err(BackendError::shape(
                "moe_combine",
                &[("y", &y.shape)],
                format!("one row for each of {} assignments", r.tokens * r.top_k),
            )));
        }
        let len = r.tokens * cols;
        let mut out = self.output_f32(len)?;
        let (l32, c32, k32) = (
            u32_arg("moe_combine", len)?,
            u32_arg("moe_combine", cols)?,
            u32_arg("moe_combine", r.top_k)?,
        );
        let mut b = self
            .dev
            .stream
            .launch_builder(self.dev.function("moe_combine")?);
        b.arg(y.f32("moe_combine")?)
            .arg(&r.weights)
            .arg(&mut out)
            .arg(&l32)
            .arg(&c32)
            .arg(&k32);
        // SAFETY: moe_combine(const float*, const float*, float*, u32 len, u32 cols, u32 top_k)
        // over len = tokens·cols outputs; y holds tokens·top_k rows of cols.
        unsafe { b.launch(elementwise(len)) }.map_err(CudaError::from)?;
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: vec![r.tokens, cols],
        })
    }
}
