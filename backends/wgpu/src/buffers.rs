//! Buffers and dispatches: uploads, poisoned outputs (so an element a kernel forgets to write
//! fails the comparison), read-back, and one-kernel dispatches with bind groups built from the
//! pipeline's own layout.

use wgpu::util::DeviceExt;

use crate::context::{GpuContext, GpuError, GpuResult};
use infer_shaders::Kernel;

/// Invocations per workgroup of the 1-D kernels (their `WG` override default).
pub const WG: u32 = 64;
/// Workgroups along x before a 1-D dispatch spills into y.
const MAX_X: u32 = 65_535;

impl GpuContext {
    pub fn upload_f32(&self, data: &[f32]) -> wgpu::Buffer {
        self.storage(bytemuck::cast_slice(data))
    }

    pub fn upload_u32(&self, data: &[u32]) -> wgpu::Buffer {
        self.storage(bytemuck::cast_slice(data))
    }

    fn storage(&self, bytes: &[u8]) -> wgpu::Buffer {
        // Empty bindings are invalid: keep at least one element.
        let bytes = if bytes.is_empty() {
            &[0u8; 4][..]
        } else {
            bytes
        };
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            })
    }

    /// An output buffer of `len` f32 filled with NaN.
    pub fn poisoned_f32(&self, len: usize) -> wgpu::Buffer {
        self.upload_f32(&vec![f32::NAN; len.max(1)])
    }

    pub fn uniform<T: bytemuck::Pod>(&self, value: &T) -> wgpu::Buffer {
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytemuck::bytes_of(value),
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    /// Runs `kernel`'s `entry` once with `buffers` bound at 0, 1, ... in order.
    pub fn dispatch(
        &self,
        kernel: &Kernel,
        entry: &'static str,
        buffers: &[&wgpu::Buffer],
        workgroups: (u32, u32, u32),
    ) {
        let pipeline = self.pipeline(kernel, entry);
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel.name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(workgroups.0, workgroups.1, workgroups.2);
        }
        self.queue.submit([encoder.finish()]);
    }

    /// Workgroups covering `n` invocations of a 1-D kernel, and the row stride (invocations
    /// per row of the grid) the kernel uses to rebuild its index.
    pub fn grid_1d(n: usize) -> ((u32, u32, u32), u32) {
        let groups = (n as u32).div_ceil(WG).max(1);
        let x = groups.min(MAX_X);
        ((x, groups.div_ceil(x), 1), x * WG)
    }

    /// Reads `len` f32 back, waiting for the work that writes them.
    pub fn read_f32(&self, buffer: &wgpu::Buffer, len: usize) -> GpuResult<Vec<f32>> {
        Ok(bytemuck::cast_slice(&self.read_bytes(buffer, len * 4)?).to_vec())
    }

    pub fn read_u32(&self, buffer: &wgpu::Buffer, len: usize) -> GpuResult<Vec<u32>> {
        Ok(bytemuck::cast_slice(&self.read_bytes(buffer, len * 4)?).to_vec())
    }

    fn read_bytes(&self, buffer: &wgpu::Buffer, bytes: usize) -> GpuResult<Vec<u8>> {
        let size = (bytes as u64).div_ceil(4) * 4;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read-back"),
            size: size.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, size);
        self.queue.submit([encoder.finish()]);
        let slice = staging.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Op(format!("waiting for the GPU: {e}")))?;
        rx.recv()
            .map_err(|e| GpuError::Op(format!("read-back never completed: {e}")))?
            .map_err(|e| GpuError::Op(format!("mapping the read-back buffer: {e}")))?;
        let data = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Op(format!("reading the mapped buffer: {e}")))?;
            view[..bytes].to_vec()
        };
        staging.unmap();
        Ok(data)
    }
}
