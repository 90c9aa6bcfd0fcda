//! Records a whole engine step into one command encoder: dispatches go into one open compute
//! pass (wgpu puts the barriers between dispatches), each kernel's parameter block takes a
//! 256-byte slot of a uniform arena written once at submission, and bind groups are cached by
//! (pipeline, bound ranges), which repeat step after step because the buffer pool and the
//! arena hand out the same buffers in the same order. `GpuContext::flush` submits.

use std::collections::HashMap;

use bytemuck::Pod;

use crate::pool::GpuBuffer;

/// Bytes per parameter slot (WebGPU's largest `minUniformBufferOffsetAlignment`).
const SLOT: usize = 256;
/// Slots per arena chunk (64 KiB: WebGPU's default `maxUniformBufferBindingSize`).
const SLOTS_PER_CHUNK: usize = 256;
/// Cached bind groups kept before the cache starts over (it also keeps buffers alive).
const MAX_BIND_GROUPS: usize = 8192;

struct Chunk {
    buffer: wgpu::Buffer,
    shadow: Vec<u8>,
}

/// Uniform parameter blocks of the open encoder.
#[derive(Default)]
pub struct ParamArena {
    chunks: Vec<Chunk>,
    used: usize,
}

/// Where a parameter block went.
pub struct ParamSlot {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl ParamArena {
    pub fn push<P: Pod>(&mut self, device: &wgpu::Device, value: &P) -> ParamSlot {
        let bytes = bytemuck::bytes_of(value);
        let (chunk, slot) = (self.used / SLOTS_PER_CHUNK, self.used % SLOTS_PER_CHUNK);
        if chunk == self.chunks.len() {
            self.chunks.push(Chunk {
                buffer: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("params"),
                    size: (SLOT * SLOTS_PER_CHUNK) as u64,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                shadow: vec![0; SLOT * SLOTS_PER_CHUNK],
            });
        }
        self.used += 1;
        let c = &mut self.chunks[chunk];
        let at = slot * SLOT;
        c.shadow[at..at + bytes.len()].copy_from_slice(bytes);
        let offset = at as u64;
        ParamSlot {
            buffer: c.buffer.clone(),
            offset,
            // Uniform bindings are sized in multiples of 16 bytes.
            size: (bytes.len() as u64).div_ceil(16) * 16,
        }
    }

    /// Writes the used slots (before the submission that reads them) and starts over.
    pub fn upload_and_reset(&mut self, queue: &wgpu::Queue) {
        let mut left = self.used;
        for c in &self.chunks {
            if left == 0 {
                break;
            }
            let n = left.min(SLOTS_PER_CHUNK);
            queue.write_buffer(&c.buffer, 0, &c.shadow[..n * SLOT]);
            left -= n;
        }
        self.used = 0;
    }
}

/// A bound range: buffer, offset, size.
type Range = (wgpu::Buffer, u64, u64);

#[derive(Default)]
pub struct Recorder {
    pub encoder: Option<wgpu::CommandEncoder>,
    pub pass: Option<wgpu::ComputePass<'static>>,
    pub params: ParamArena,
    bind_groups: HashMap<(wgpu::ComputePipeline, Vec<Range>), wgpu::BindGroup>,
}

impl Recorder {
    pub fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        // A pass borrows the encoder: close it before recording anything else.
        self.pass = None;
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("step"),
            })
        })
    }

    fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        let pass = match self.pass.take() {
            Some(pass) => pass,
            None => self
                .encoder(device)
                .begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                .forget_lifetime(),
        };
        self.pass.insert(pass)
    }

    /// Opens a pass that writes timestamps at its start and end (kernel benchmarks).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))] // used by the native kernel benchmarks
    pub fn timed_pass(&mut self, device: &wgpu::Device, queries: &wgpu::QuerySet, first: u32) {
        let pass = self
            .encoder(device)
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("timed"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: queries,
                    beginning_of_pass_write_index: Some(first),
                    end_of_pass_write_index: Some(first + 1),
                }),
            })
            .forget_lifetime();
        self.pass = Some(pass);
    }

    pub fn dispatch<P: Pod>(
        &mut self,
        device: &wgpu::Device,
        pipeline: &wgpu::ComputePipeline,
        buffers: &[&GpuBuffer],
        params: &P,
        grid: (u32, u32, u32),
    ) {
        let slot = self.params.push(device, params);
        let mut ranges: Vec<Range> = buffers
            .iter()
            .map(|b| ((**b).clone(), 0, b.len_bytes().div_ceil(4) * 4))
            .collect();
        ranges.push((slot.buffer, slot.offset, slot.size));
        if self.bind_groups.len() >= MAX_BIND_GROUPS {
            self.bind_groups.clear();
        }
        let bind_group = self
            .bind_groups
            .entry((pipeline.clone(), ranges))
            .or_insert_with_key(|(pipeline, ranges)| {
                let entries: Vec<wgpu::BindGroupEntry> = ranges
                    .iter()
                    .zip(0u32..)
                    .map(|((buffer, offset, size), binding)| wgpu::BindGroupEntry {
                        binding,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer,
                            offset: *offset,
                            size: wgpu::BufferSize::new(*size),
                        }),
                    })
                    .collect();
                device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &entries,
                })
            })
            .clone();
        let pass = self.pass(device);
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(grid.0, grid.1, grid.2);
    }
}
