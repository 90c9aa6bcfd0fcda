//! Buffers and dispatches on top of the recorder: uploads, pooled kernel outputs (NaN-poisoned
//! when asked, so an element a kernel forgets to write fails the comparison), dispatches into
//! the step's encoder, the submission, and read-back.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_channel::oneshot;
use wgpu::util::DeviceExt;

use crate::context::{lock, GpuContext, GpuError, GpuResult};
use crate::pool::{GpuBuffer, Use, STORAGE_USAGE};
use infer_core::BackendError;
use infer_shaders::{self as shaders, FillParams, Kernel, KernelParams};

/// Invocations per workgroup of the 1-D kernels (their `WG` override default).
pub const WG: u32 = 64;
/// Workgroups along x before a 1-D dispatch spills into y.
const MAX_X: u32 = 65_535;

impl GpuContext {
    /// A device buffer holding `data`, owned by the caller (weights, tables).
    pub fn upload_f32(&self, data: &[f32]) -> GpuBuffer {
        self.storage(bytemuck::cast_slice(data))
    }

    pub fn upload_u32(&self, data: &[u32]) -> GpuBuffer {
        self.storage(bytemuck::cast_slice(data))
    }

    pub fn upload_bytes(&self, bytes: &[u8]) -> GpuBuffer {
        self.storage(bytes)
    }

    fn storage(&self, bytes: &[u8]) -> GpuBuffer {
        // Empty bindings are invalid: keep at least one element.
        let bytes = if bytes.is_empty() {
            &[0u8; 4][..]
        } else {
            bytes
        };
        GpuBuffer::owned(
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: None,
                    contents: bytes,
                    usage: STORAGE_USAGE,
                }),
        )
    }

    /// A zero-filled device buffer of `bytes`, owned by the caller (the KV cache).
    pub fn zeroed(&self, bytes: u64) -> GpuBuffer {
        GpuBuffer::owned(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("zeroed"),
            size: bytes.max(4).div_ceil(4) * 4,
            usage: STORAGE_USAGE,
            mapped_at_creation: false,
        }))
    }

    /// Per-step data (batch metadata) in a pooled buffer, written before the step's work.
    pub fn stage_u32(&self, data: &[u32]) -> GpuBuffer {
        let buffer = self.pool.acquire(data.len() as u64 * 4, Use::Upload);
        if !data.is_empty() {
            self.queue
                .write_buffer(&buffer, 0, bytemuck::cast_slice(data));
        }
        buffer
    }

    /// A pooled output of `len` 32-bit elements for a kernel of the open step.
    pub fn output(&self, len: usize) -> GpuResult<GpuBuffer> {
        let out = self.pool.acquire(len as u64 * 4, Use::KernelOutput);
        if self.poison_outputs.load(Ordering::Relaxed) {
            let (grid, stride) = Self::grid_1d(len);
            let p = FillParams {
                len: crate::kernels::u(len)?,
                bits: f32::NAN.to_bits(),
                row_stride: stride,
                ..Default::default()
            };
            self.dispatch(&shaders::FILL, "main", &[&out], &p, grid)?;
        }
        Ok(out)
    }

    /// Records `kernel`'s `entry` with `buffers` bound at 0, 1, ... and `params` (a uniform
    /// laid out as the kernel's `Params`) after them. Empty grids record nothing.
    pub fn dispatch<P: KernelParams>(
        &self,
        kernel: &Kernel<P>,
        entry: &'static str,
        buffers: &[&GpuBuffer],
        params: &P,
        grid: (u32, u32, u32),
    ) -> GpuResult<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let max = self.limits.max_compute_workgroups_per_dimension;
        if grid.0 > max || grid.1 > max || grid.2 > max {
            let largest = grid.0.max(grid.1).max(grid.2);
            return Err(GpuError::Op(BackendError::too_large(
                kernel.name,
                "workgroups along one grid dimension",
                largest.into(),
                max.into(),
            )));
        }
        let pipeline = self.pipeline(kernel, entry);
        lock(&self.recorder).dispatch(&self.device, &pipeline, buffers, params, grid);
        Ok(())
    }

    /// Records a buffer-to-buffer copy into the step's encoder.
    pub fn copy(
        &self,
        from: &wgpu::Buffer,
        from_offset: u64,
        to: &wgpu::Buffer,
        to_offset: u64,
        bytes: u64,
    ) {
        if bytes > 0 {
            lock(&self.recorder)
                .encoder(&self.device)
                .copy_buffer_to_buffer(from, from_offset, to, to_offset, bytes);
        }
    }

    /// Submits everything recorded since the last submission (one command buffer), then
    /// reports any error wgpu raised meanwhile.
    pub fn flush(&self) -> GpuResult<()> {
        let mut rec = lock(&self.recorder);
        rec.pass = None;
        let encoder = rec.encoder.take();
        rec.params.upload_and_reset(&self.queue);
        if let Some(encoder) = encoder {
            self.queue.submit([encoder.finish()]);
        }
        // Still under the recorder's lock: a buffer another thread releases after recording
        // into the next encoder must not be taken for idle.
        self.pool.submitted();
        drop(rec);
        self.take_errors()
    }

    /// Waits until the device has finished all submitted work.
    pub fn wait_idle(&self) -> GpuResult<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| BackendError::device("wait_idle", e))?;
        Ok(())
    }

    /// Workgroups covering `n` invocations of a 1-D kernel, and the row stride (invocations
    /// per row of the grid) the kernel uses to rebuild its index.
    pub fn grid_1d(n: usize) -> ((u32, u32, u32), u32) {
        // Past u32 the grid saturates; no buffer a kernel binds holds 2^32 elements.
        let groups = u32::try_from(n).unwrap_or(u32::MAX).div_ceil(WG);
        let x = groups.clamp(1, MAX_X);
        ((x, groups.div_ceil(x), 1), x * WG)
    }

    /// Reads `len` f32 back, submitting and waiting for the work that writes them.
    pub fn read_f32(&self, buffer: &wgpu::Buffer, len: usize) -> GpuResult<Vec<f32>> {
        Ok(bytemuck::cast_slice(&self.read_bytes(&[(buffer, 0, len as u64 * 4)])?).to_vec())
    }

    pub fn read_u32(&self, buffer: &wgpu::Buffer, len: usize) -> GpuResult<Vec<u32>> {
        Ok(bytemuck::cast_slice(&self.read_bytes(&[(buffer, 0, len as u64 * 4)])?).to_vec())
    }

    /// Reads byte ranges `(buffer, offset, bytes)` (multiples of 4) back, concatenated, with
    /// one submission and one mapping, blocking until the device is done (native only: in the
    /// browser the mapping completes only when the event loop runs, see `read_bytes_async`).
    pub fn read_bytes(&self, ranges: &[(&wgpu::Buffer, u64, u64)]) -> GpuResult<Vec<u8>> {
        let mut read = self.begin_read(ranges)?;
        if cfg!(target_arch = "wasm32") {
            return Err(BackendError::unsupported(
                "read_bytes",
                "a blocking read-back on the web (read_bytes_async is the web's)",
            )
            .into());
        }
        // Another thread polling the same device may be the one that runs our mapping's
        // callback: its fence has passed once `wait_idle` returns, but the callback can fire
        // a moment later on that thread, so wait for it (bounded, in case the device died).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mapped = loop {
            self.wait_idle()?;
            match read.mapped.try_recv() {
                Ok(Some(mapped)) => break mapped,
                Ok(None) if std::time::Instant::now() < deadline => std::thread::yield_now(),
                _ => {
                    return Err(
                        BackendError::device("read_bytes", "the read-back never completed").into(),
                    )
                }
            }
        };
        self.finish_read(read, mapped)
    }

    /// `read_bytes` without blocking: the copies are submitted now and the future completes
    /// once the staging buffer is mapped (natively after `wait_idle`, in the browser when the
    /// event loop delivers the mapping).
    pub fn read_bytes_async(
        self: &Arc<Self>,
        ranges: &[(&wgpu::Buffer, u64, u64)],
    ) -> GpuResult<impl Future<Output = GpuResult<Vec<u8>>> + 'static> {
        let read = self.begin_read(ranges)?;
        let ctx = self.clone();
        Ok(async move {
            let mut read = read;
            let mapped = (&mut read.mapped).await.map_err(|_| {
                BackendError::device(
                    "read_bytes",
                    "the read-back was dropped (was the device lost?)",
                )
            })?;
            ctx.finish_read(read, mapped)
        })
    }

    /// Records the copies into a staging buffer, submits, and asks for the mapping.
    fn begin_read(&self, ranges: &[(&wgpu::Buffer, u64, u64)]) -> GpuResult<PendingRead> {
        let total: u64 = ranges.iter().map(|r| r.2).sum();
        // A read in flight keeps its staging buffer; the next one makes its own.
        let staging = match lock(&self.staging).take() {
            Some(s) if s.size() >= total => s,
            _ => self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("read-back"),
                size: total.max(256).next_power_of_two(),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        let mut at = 0;
        for &(buffer, offset, bytes) in ranges {
            self.copy(buffer, offset, &staging, at, bytes);
            at += bytes;
        }
        self.flush()?;
        let (tx, mapped) = oneshot::channel();
        if total == 0 {
            let _ = tx.send(Ok(()));
        } else {
            staging
                .slice(..total)
                .map_async(wgpu::MapMode::Read, move |r| {
                    let _ = tx.send(r);
                });
        }
        Ok(PendingRead {
            staging,
            total,
            mapped,
        })
    }

    fn finish_read(
        &self,
        read: PendingRead,
        mapped: Result<(), wgpu::BufferAsyncError>,
    ) -> GpuResult<Vec<u8>> {
        mapped.map_err(|e| BackendError::device("map read-back", e))?;
        let data = if read.total == 0 {
            Vec::new()
        } else {
            let slice = read.staging.slice(..read.total);
            let view = slice
                .get_mapped_range()
                .map_err(|e| BackendError::device("read mapped buffer", e))?;
            let data = view.to_vec();
            drop(view);
            read.staging.unmap();
            data
        };
        let mut slot = lock(&self.staging);
        if slot.as_ref().is_none_or(|s| s.size() < read.staging.size()) {
            *slot = Some(read.staging);
        }
        drop(slot);
        self.take_errors()?;
        Ok(data)
    }
}

/// A read-back between its submission and its mapping.
struct PendingRead {
    staging: wgpu::Buffer,
    total: u64,
    mapped: oneshot::Receiver<Result<(), wgpu::BufferAsyncError>>,
}
