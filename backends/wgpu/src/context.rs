//! The GPU context: adapter choice (honouring `WGPU_BACKEND` and `WGPU_ADAPTER_NAME`, never
//! panicking on a name that matches nothing), the device and queue, and a cache of compute
//! pipelines built from `infer-shaders` kernels.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use infer_core::{BackendError, InferError};
use infer_shaders::Kernel;

use crate::pool::BufferPool;
use crate::recorder::Recorder;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU adapter{}; adapters seen: {}", .wanted.as_ref().map(|w| format!(" matches WGPU_ADAPTER_NAME={w:?}")).unwrap_or_default(), if .seen.is_empty() { "none (is a Vulkan driver such as mesa-vulkan-drivers installed?)".to_string() } else { .seen.join("; ") })]
    NoAdapter {
        wanted: Option<String>,
        seen: Vec<String>,
    },
    #[error("requesting a device from {adapter}: {message}")]
    Device { adapter: String, message: String },
    /// An op failed on a device we have (shapes, limits, the device itself).
    #[error(transparent)]
    Op(#[from] BackendError),
}

/// A backend op's error as the engine reports it.
pub(crate) fn wgpu_err(e: BackendError) -> InferError {
    e.on("wgpu")
}

/// A failed op names its backend; no adapter or device means the backend is unavailable.
pub(crate) fn gpu_err(e: GpuError) -> InferError {
    match e {
        GpuError::Op(e) => wgpu_err(e),
        other => InferError::BackendUnavailable {
            backend: "wgpu",
            reason: other.to_string(),
        },
    }
}

pub type GpuResult<T> = std::result::Result<T, GpuError>;

pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    pipelines: Mutex<HashMap<(&'static str, &'static str), wgpu::ComputePipeline>>,
    pub(crate) pool: BufferPool,
    pub(crate) recorder: Mutex<Recorder>,
    /// Read-back staging buffer, grown on demand.
    pub(crate) staging: Mutex<Option<wgpu::Buffer>>,
    /// Why the device was lost, once it was (the browser can take a device away).
    lost: Arc<Mutex<Option<String>>>,
    /// Validation and out-of-memory errors wgpu reported since the last check (instead of
    /// its default handler, which panics).
    errors: Arc<Mutex<Vec<String>>>,
    /// Fill every kernel output with NaN first, so an element a kernel forgets to write
    /// fails a comparison (tests).
    pub(crate) poison_outputs: AtomicBool,
    /// Use the kernels without workgroup barriers where there are two (decode matmul, RMS
    /// norm): see `barrier_free_by_default`.
    pub(crate) barrier_free: AtomicBool,
}

/// SwiftShader (the browser's fallback adapter, and Chrome's WebGPU with no GPU) runs a
/// workgroup barrier by switching invocations one by one: the cooperative decode matmul is
/// ~45x slower there than the barrier-free one (`infer bench kernels`). lavapipe handles
/// barriers well and is faster with the cooperative kernel for one row, so it keeps it.
fn barrier_free_by_default(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu && !info.driver.contains("llvmpipe")
}

fn describe(info: &wgpu::AdapterInfo) -> String {
    format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type)
}

impl GpuContext {
    /// Opens the adapter named by `WGPU_ADAPTER_NAME` (a case-insensitive substring), else the
    /// first discrete GPU, else any, among the backends of `WGPU_BACKEND` (all by default).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> GpuResult<Self> {
        pollster::block_on(Self::open(
            wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all()),
            std::env::var("WGPU_ADAPTER_NAME").ok(),
        ))
    }

    pub async fn open(backends: wgpu::Backends, wanted: Option<String>) -> GpuResult<Self> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapters = instance.enumerate_adapters(backends).await;
        let seen: Vec<String> = adapters.iter().map(|a| describe(&a.get_info())).collect();
        let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Cpu => 3,
            wgpu::DeviceType::Other => 4,
        };
        let adapter = match &wanted {
            Some(name) => {
                let name = name.to_lowercase();
                adapters
                    .into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&name))
            }
            None => adapters.into_iter().min_by_key(rank),
        };
        let Some(adapter) = adapter else {
            return Err(GpuError::NoAdapter { wanted, seen });
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        let features =
            adapter.features() & (wgpu::Features::SHADER_F16 | wgpu::Features::TIMESTAMP_QUERY);
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("infer"),
                required_features: features,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::Device {
                adapter: describe(&info),
                message: e.to_string(),
            })?;
        tracing::info!(adapter = %describe(&info), "wgpu adapter");
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            lock(&sink).push(e.to_string());
        }));
        let lost: Arc<Mutex<Option<String>>> = Arc::default();
        let lost_sink = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            // `Destroyed` is our own drop; anything else is the driver or browser.
            if reason != wgpu::DeviceLostReason::Destroyed {
                tracing::error!(?reason, %message, "GPU device lost");
            }
            *lock(&lost_sink) = Some(format!("the GPU device was lost ({reason:?}): {message}"));
        });
        Ok(GpuContext {
            pool: BufferPool::new(device.clone()),
            device,
            queue,
            limits,
            features,
            pipelines: Mutex::new(HashMap::new()),
            recorder: Mutex::default(),
            staging: Mutex::new(None),
            lost,
            errors,
            poison_outputs: AtomicBool::new(false),
            barrier_free: AtomicBool::new(barrier_free_by_default(&info)),
            info,
        })
    }

    /// Why the device was lost, if it was.
    pub fn lost(&self) -> Option<String> {
        lock(&self.lost).clone()
    }

    /// The errors wgpu reported since the last call (or the device's loss), as one error.
    pub fn take_errors(&self) -> GpuResult<()> {
        if let Some(why) = self.lost() {
            return Err(BackendError::device("device lost", why).into());
        }
        let errors = std::mem::take(&mut *lock(&self.errors));
        if errors.is_empty() {
            Ok(())
        } else {
            Err(BackendError::device("wgpu validation", errors.join("; ")).into())
        }
    }

    /// Makes every kernel output start as NaN (tests: an unwritten element then fails).
    pub fn set_poison_outputs(&self, on: bool) {
        self.poison_outputs
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Chooses the barrier-free kernels (the default on CPU adapters) or the cooperative ones
    /// (tests run both on every adapter).
    pub fn set_barrier_free_kernels(&self, on: bool) {
        self.barrier_free
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn barrier_free_kernels(&self) -> bool {
        self.barrier_free.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes the activation pool holds on the device.
    pub fn pooled_bytes(&self) -> u64 {
        self.pool.created_bytes()
    }

    pub fn adapter_name(&self) -> String {
        describe(&self.info)
    }

    /// The pipeline of `kernel`'s `entry`, compiled once (bind group layout from the shader).
    pub fn pipeline<P>(&self, kernel: &Kernel<P>, entry: &'static str) -> wgpu::ComputePipeline {
        let mut cache = lock(&self.pipelines);
        cache
            .entry((kernel.name, entry))
            .or_insert_with(|| {
                let module = self
                    .device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(kernel.name),
                        source: wgpu::ShaderSource::Wgsl(kernel.source.into()),
                    });
                self.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(kernel.name),
                        layout: None,
                        module: &module,
                        entry_point: Some(entry),
                        compilation_options: Default::default(),
                        cache: None,
                    })
            })
            .clone()
    }
}

/// Locks ignoring poisoning: every guarded value stays consistent across a panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
