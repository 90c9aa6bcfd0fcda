//! The GPU context: adapter choice (honouring `WGPU_BACKEND` and `WGPU_ADAPTER_NAME`, never
//! panicking on a name that matches nothing), the device and queue, and a cache of compute
//! pipelines built from `infer-shaders` kernels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use infer_shaders::Kernel;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU adapter{}; adapters seen: {}", .wanted.as_ref().map(|w| format!(" matches WGPU_ADAPTER_NAME={w:?}")).unwrap_or_default(), if .seen.is_empty() { "none (is a Vulkan driver such as mesa-vulkan-drivers installed?)".to_string() } else { .seen.join("; ") })]
    NoAdapter {
        wanted: Option<String>,
        seen: Vec<String>,
    },
    #[error("requesting a device from {adapter}: {message}")]
    Device { adapter: String, message: String },
    #[error("{0}")]
    Op(String),
}

pub type GpuResult<T> = std::result::Result<T, GpuError>;

pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    pipelines: Mutex<HashMap<(&'static str, &'static str), Arc<wgpu::ComputePipeline>>>,
}

fn describe(info: &wgpu::AdapterInfo) -> String {
    format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type)
}

impl GpuContext {
    /// Opens the adapter named by `WGPU_ADAPTER_NAME` (a case-insensitive substring), else the
    /// first discrete GPU, else any, among the backends of `WGPU_BACKEND` (all by default).
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
        let features = adapter.features() & wgpu::Features::SHADER_F16;
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
        Ok(GpuContext {
            device,
            queue,
            info,
            limits,
            features,
            pipelines: Mutex::new(HashMap::new()),
        })
    }

    pub fn adapter_name(&self) -> String {
        describe(&self.info)
    }

    /// The pipeline of `kernel`'s `entry`, compiled once (bind group layout from the shader).
    pub fn pipeline(&self, kernel: &Kernel, entry: &'static str) -> Arc<wgpu::ComputePipeline> {
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry((kernel.name, entry))
            .or_insert_with(|| {
                let module = self
                    .device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(kernel.name),
                        source: wgpu::ShaderSource::Wgsl(kernel.source.into()),
                    });
                Arc::new(
                    self.device
                        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some(kernel.name),
                            layout: None,
                            module: &module,
                            entry_point: Some(entry),
                            compilation_options: Default::default(),
                            cache: None,
                        }),
                )
            })
            .clone()
    }
}
