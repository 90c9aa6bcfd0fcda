//! RMSNorm over whole rows or per head, and the residual add fused with it.

use cudarc::driver::PushKernelArg;
use infer_core::BackendError;

use crate::backend::CudaBackend;
use crate::device::{launch_rows, threads_for};
use crate::error::u32_arg;
use crate::error::CudaError;
use crate::tensor::{CudaTensor, Storage};

impl CudaBackend {
    /// `Backend::rms_norm`: each run of `weight.len()` values of `x` normed.
    pub(crate) fn norm_rows(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor, CudaError> {
        let (rows, cols) = x.rows_cols();
        let n = weight.len();
        if n == 0 || !cols.is_multiple_of(n) {
            return Err(BackendError::shape(
                "rms_norm",
                &[("x", &x.shape), ("weight", &weight.shape)],
                "a row of x is a whole number of weight vectors",
            )
            .into());
        }
        // Every element is written by the kernel below. Each run of the weight's length is a
        // row of the kernel (a head, for q/k norms).
        let mut out = self.output_f32(rows * cols)?;
        let (rows, cols) = (rows * cols / n, n);
        let c = u32_arg("rms_norm", cols)?;
        let mut b = self
            .dev
            .stream
            .launch_builder(self.dev.function("rms_norm")?);
        b.arg(x.f32("rms_norm")?)
            .arg(weight.f32("rms_norm")?)
            .arg(&mut out)
            .arg(&c)
            .arg(&eps);
        // SAFETY: rms_norm(const float*, const float*, float*, u32, float), one block per row
        // of a multiple of 32 threads (as block_sum needs).
        unsafe { launch_rows(&mut b, rows, threads_for(cols)) }?;
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: x.shape.clone(),
        })
    }

    /// `x += y`, then whole rows of `x` normed (`weight` as wide as a row).
    pub(crate) fn add_norm_rows(
        &self,
        x: &mut CudaTensor,
        y: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor, CudaError> {
        if x.len() != y.len() {
            return Err(BackendError::shape(
                "add_rms_norm",
                &[("x", &x.shape), ("y", &y.shape)],
                "equal element counts",
            )
            .into());
        }
        let (rows, cols) = x.rows_cols();
        if weight.len() != cols {
            return Err(BackendError::shape(
                "add_rms_norm",
                &[("x", &x.shape), ("weight", &weight.shape)],
                "one weight per column of x",
            )
            .into());
        }
        // Every element is written by the kernel below.
        let mut out = self.output_f32(rows * cols)?;
        let c = u32_arg("add_rms_norm", cols)?;
        let f = self.dev.function("add_rms_norm")?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(x.f32_mut("add_rms_norm")?)
            .arg(y.f32("add_rms_norm")?)
            .arg(weight.f32("add_rms_norm")?)
            .arg(&mut out)
            .arg(&c)
            .arg(&eps);
        // SAFETY: add_rms_norm(float*, const float*, const float*, float*, u32, float): x, y
        // and out hold rows * cols, weight cols; one block per row of a multiple of 32
        // threads (as block_sum needs).
        unsafe { launch_rows(&mut b, rows, threads_for(cols)) }?;
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: x.shape.clone(),
        })
    }
}
