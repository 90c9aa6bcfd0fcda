//! Tensors of the wgpu backend: activations are one f32 buffer; weight matrices may be stored
//! as packed f16 and are split by rows into parts that each fit one storage binding (WebGPU
//! guarantees 128 MiB; a 128k-vocabulary embedding is several times that).

use std::sync::Arc;

use half::f16;
use infer_core::backend::DeviceTensor;
use infer_core::error::Result;
use infer_core::weights::HostTensor;
use infer_core::BackendError;

use crate::context::{wgpu_err, GpuContext};
use crate::kernels::{MatrixRef, WeightStorage};
use crate::pool::GpuBuffer;

#[derive(Clone)]
pub struct WgpuTensor {
    parts: Arc<Vec<GpuBuffer>>,
    /// Rows per part.
    part_rows: usize,
    storage: WeightStorage,
    shape: Vec<usize>,
}

impl std::fmt::Debug for WgpuTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuTensor")
            .field("shape", &self.shape)
            .field("storage", &self.storage)
            .field("parts", &self.parts.len())
            .finish()
    }
}

impl DeviceTensor for WgpuTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
}

impl WgpuTensor {
    /// An f32 activation in one buffer.
    pub(crate) fn activation(buffer: GpuBuffer, shape: Vec<usize>) -> Self {
        let rows = shape.iter().rev().skip(1).product();
        WgpuTensor {
            parts: Arc::new(vec![buffer]),
            part_rows: rows,
            storage: WeightStorage::F32,
            shape,
        }
    }

    /// Uploads `t` as `storage`, split by rows so each part fits `max_binding` bytes.
    pub(crate) fn upload(
        ctx: &GpuContext,
        t: &HostTensor,
        storage: WeightStorage,
        max_binding: u64,
    ) -> Result<Self> {
        let cols = t.shape.last().copied().unwrap_or(1).max(1);
        let rows = t.data.len() / cols;
        let row_bytes = (cols * storage.bytes_per_element()) as u64;
        let part_rows = usize::try_from(max_binding / row_bytes).unwrap_or(usize::MAX);
        if part_rows == 0 {
            return Err(wgpu_err(BackendError::too_large(
                "upload",
                "bytes in one row (a row is never split across bindings)",
                row_bytes,
                max_binding,
            )));
        }
        // Matrices, and stacks of them (experts), split at any row.
        if rows > part_rows && !(2..=3).contains(&t.shape.len()) {
            return Err(wgpu_err(BackendError::unsupported(
                "upload",
                format!(
                    "splitting {:?}, which is not a matrix, across storage bindings",
                    t.shape
                ),
            )));
        }
        let parts = t
            .data
            .chunks(part_rows * cols)
            .map(|chunk| match storage {
                WeightStorage::F32 => ctx.upload_f32(chunk),
                WeightStorage::F16 => {
                    let halves: Vec<u16> =
                        chunk.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
                    ctx.upload_bytes(bytemuck::cast_slice(&halves))
                }
            })
            .collect::<Vec<_>>();
        let parts = if parts.is_empty() {
            vec![ctx.upload_f32(&[])]
        } else {
            parts
        };
        Ok(WgpuTensor {
            parts: Arc::new(parts),
            part_rows: part_rows.min(rows.max(1)),
            storage,
            shape: t.shape.clone(),
        })
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.shape.last().copied().unwrap_or(1);
        (self.len() / cols.max(1), cols)
    }

    pub fn storage(&self) -> WeightStorage {
        self.storage
    }

    pub fn num_parts(&self) -> usize {
        self.parts.len()
    }

    /// The single f32 buffer of an activation (or small weight) for element-wise kernels.
    pub(crate) fn buf(&self, op: &'static str) -> Result<&GpuBuffer> {
        if self.parts.len() != 1 || self.storage != WeightStorage::F32 {
            return Err(wgpu_err(BackendError::unsupported(
                op,
                format!(
                    "{:?} in {} {:?} parts (the op takes one f32 buffer)",
                    self.shape,
                    self.parts.len(),
                    self.storage
                ),
            )));
        }
        Ok(&self.parts[0])
    }

    pub(crate) fn matrix(&self) -> MatrixRef<'_> {
        let (rows, cols) = self.rows_cols();
        MatrixRef {
            parts: &self.parts,
            part_rows: self.part_rows,
            rows,
            cols,
            storage: self.storage,
        }
    }
}
