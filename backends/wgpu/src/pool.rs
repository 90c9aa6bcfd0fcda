//! A pool of storage buffers in power-of-two size classes, so a decode step allocates nothing:
//! activations freed during a step are reused later in the same step (the GPU runs the
//! recorded dispatches in order), and the same allocation sequence step after step gives the
//! same buffers, which lets bind groups be cached.
//!
//! One hazard shapes the design: `Queue::write_buffer` lands before *every* command of the
//! next submission. A buffer that commands recorded in the still-open encoder use must not be
//! the target of such a write, so buffers released since the last submission are handed out
//! only as kernel outputs, never as upload targets, until the submission happens.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

/// Smallest pooled size (bytes).
const MIN_CLASS: u64 = 256;

#[derive(Default)]
struct Lists {
    /// Free and untouched by the open encoder: good for anything.
    idle: HashMap<u64, Vec<wgpu::Buffer>>,
    /// Released since the last submission: kernel outputs only.
    recent: HashMap<u64, Vec<wgpu::Buffer>>,
    /// Bytes of every buffer the pool has created.
    created_bytes: u64,
}

#[derive(Clone)]
pub struct BufferPool {
    device: wgpu::Device,
    lists: Arc<Mutex<Lists>>,
}

/// What a buffer is acquired for (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Written by a kernel of the open encoder.
    KernelOutput,
    /// Written with `Queue::write_buffer` before the next submission.
    Upload,
}

/// A storage buffer, returned to its pool on drop when it came from one.
pub struct GpuBuffer {
    buffer: wgpu::Buffer,
    pool: Option<BufferPool>,
    /// Bytes the owner asked for (the buffer may be larger).
    len_bytes: u64,
}

impl Deref for GpuBuffer {
    type Target = wgpu::Buffer;
    fn deref(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl GpuBuffer {
    /// A buffer that is not pooled (weights, the KV cache).
    pub fn owned(buffer: wgpu::Buffer) -> Self {
        let len_bytes = buffer.size();
        GpuBuffer {
            buffer,
            pool: None,
            len_bytes,
        }
    }

    /// Bytes in use (bindings cover exactly these).
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// Binding of the used bytes, so a larger pooled buffer binds like an exact one.
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: 0,
            size: wgpu::BufferSize::new(self.len_bytes.max(4).div_ceil(4) * 4),
        })
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            let mut lists = pool.lists.lock().unwrap_or_else(|e| e.into_inner());
            lists
                .recent
                .entry(self.buffer.size())
                .or_default()
                .push(self.buffer.clone());
        }
    }
}

pub const STORAGE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

fn class(bytes: u64) -> u64 {
    bytes.max(MIN_CLASS).next_power_of_two()
}

impl BufferPool {
    pub fn new(device: wgpu::Device) -> Self {
        BufferPool {
            device,
            lists: Arc::default(),
        }
    }

    /// A storage buffer of at least `bytes` (contents unspecified).
    pub fn acquire(&self, bytes: u64, usage: Use) -> GpuBuffer {
        let size = class(bytes);
        let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
        let reused = match usage {
            Use::KernelOutput => lists
                .recent
                .get_mut(&size)
                .and_then(Vec::pop)
                .or_else(|| lists.idle.get_mut(&size).and_then(Vec::pop)),
            Use::Upload => lists.idle.get_mut(&size).and_then(Vec::pop),
        };
        let buffer = reused.unwrap_or_else(|| {
            lists.created_bytes += size;
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("pooled"),
                size,
                usage: STORAGE_USAGE,
                mapped_at_creation: false,
            })
        });
        GpuBuffer {
            buffer,
            pool: Some(self.clone()),
            len_bytes: bytes.max(4),
        }
    }

    /// Called after a submission: everything released so far is idle.
    pub fn submitted(&self) {
        let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
        let recent = std::mem::take(&mut lists.recent);
        for (size, mut buffers) in recent {
            lists.idle.entry(size).or_default().append(&mut buffers);
        }
    }

    /// Bytes of device memory the pool holds.
    pub fn created_bytes(&self) -> u64 {
        self.lists
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .created_bytes
    }
}
