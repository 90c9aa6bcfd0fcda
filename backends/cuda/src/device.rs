//! Opening a CUDA device: the library checks that keep cudarc from panicking, the context,
//! stream and cuBLAS handle, and the compiled kernels loaded as functions.

use infer_core::BackendError;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchArgs, LaunchConfig};

use crate::error::CudaError;
use crate::kernels::{compiled, nvrtc_present, SOURCES};

/// Fails with `CudaError::Unavailable` naming the first missing library. cudarc loads the
/// driver, NVRTC and cuBLAS at run time and panics on first use when one is absent, so every
/// entry point calls this first.
pub fn check_libraries() -> Result<(), CudaError> {
    // SAFETY: each check only tries to dlopen the library by its usual names.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver {
        return Err(CudaError::Unavailable(
            "libcuda.so not found (no NVIDIA driver on this machine)".into(),
        ));
    }
    if !nvrtc_present() {
        return Err(CudaError::Unavailable(
            "libnvrtc.so not found (install the CUDA toolkit's NVRTC or put it on LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    // SAFETY: as above.
    let blas = unsafe { cudarc::cublas::sys::is_culib_present() };
    if !blas {
        return Err(CudaError::Unavailable(
            "libcublas.so not found (install cuBLAS or put it on LD_LIBRARY_PATH)".into(),
        ));
    }
    Ok(())
}

/// Refuses, before any rank starts, a tensor-parallel group of `ranks` GPUs from `first`
/// that this machine cannot hold: a missing library or NCCL, or too few devices (NCCL runs
/// one rank per GPU).
pub fn check_devices(first: usize, ranks: usize) -> Result<(), CudaError> {
    check_libraries()?;
    crate::nccl::check_nccl()?;
    let count = CudaContext::device_count()?.max(0) as usize;
    if first + ranks > count {
        return Err(CudaError::Unavailable(format!(
            "--tensor-parallel-size {ranks} from CUDA device {first} needs devices {first}..={}, but {count} present (one GPU per rank)",
            first + ranks - 1
        )));
    }
    Ok(())
}

/// cuBLAS's workspace: what PyTorch gives it on Hopper (32 MiB).
const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// One device: context, its stream (all work is ordered on it), cuBLAS and the kernels.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    /// cuBLAS's workspace (after `blas`, so it is dropped after the handle).
    _blas_workspace: CudaSlice<u8>,
    pub name: String,
    pub arch: (i32, i32),
    functions: HashMap<&'static str, CudaFunction>,
}

impl Device {
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        check_libraries()?;
        let count = CudaContext::device_count()?;
        if count <= 0 {
            return Err(CudaError::Unavailable("no CUDA device found".into()));
        }
        if ordinal >= count as usize {
            return Err(CudaError::Unavailable(format!(
                "CUDA device {ordinal} requested but only {count} present"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: every buffer is used on the one stream below (cuBLAS included), so stream
        // order already serializes all reads and writes; cudarc's per-buffer events would only
        // add two event creations and destructions to every allocation of every op.
        unsafe { ctx.disable_event_tracking() };
        keep_pool_memory(&ctx)?;
        let name = ctx.name()?;
        let arch = ctx.compute_capability()?;
        // A stream of our own: CUDA graphs cannot be captured on the legacy default stream.
        let stream = ctx.new_stream()?;
        let blas = CudaBlas::new(stream.clone())?;
        // cuBLAS may allocate its workspace on first use, which a graph capture forbids; a
        // workspace of ours makes every GEMM capturable (as PyTorch does for its graphs).
        let mut blas_workspace = stream.alloc_zeros::<u8>(BLAS_WORKSPACE_BYTES)?;
        {
            use cudarc::driver::DevicePtrMut;
            let (ptr, _guard) = blas_workspace.device_ptr_mut(&stream);
            // SAFETY: the handle is ours; the workspace lives in `Device` as long as the handle
            // (and is dropped after it), and is only used on the handle's stream.
            unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut std::ffi::c_void,
                    BLAS_WORKSPACE_BYTES,
                )
            }
            .result()?;
        }
        let mut functions = HashMap::new();
        for ((file, ptx), (_, _, kernels)) in compiled(arch)?.iter().zip(SOURCES) {
            let module = ctx
                .load_module(ptx.clone())
                .map_err(|e| CudaError::Compile {
                    file: file.to_string(),
                    log: format!("loading the PTX: {e}"),
                })?;
            for k in *kernels {
                functions.insert(*k, module.load_function(k)?);
            }
        }
        tracing::info!(%name, arch = format!("sm_{}{}", arch.0, arch.1), "CUDA device opened");
        Ok(Device {
            ctx,
            stream,
            blas,
            _blas_workspace: blas_workspace,
            name,
            arch,
            functions,
        })
    }

    pub fn function(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.functions.get(name).ok_or_else(|| {
            BackendError::unsupported("kernel", format!("`{name}`, not loaded")).into()
        })
    }
}

/// Every op allocates its output from the device's default pool (`cuMemAllocAsync`). The
/// pool's default release threshold of 0 hands freed memory back to the driver at each sync,
/// so every step mapped its activations anew; keeping it makes a step's allocations pool
/// hits. `trim_pool` gives it back where free memory is measured.
fn keep_pool_memory(ctx: &CudaContext) -> Result<(), CudaError> {
    use cudarc::driver::{result, sys};
    if !pools_supported(ctx)? {
        return Ok(());
    }
    let mut threshold = u64::MAX;
    // SAFETY: the pool is the context's device's default pool; RELEASE_THRESHOLD takes a u64.
    unsafe {
        let pool = result::device::get_default_mem_pool(ctx.cu_device())?;
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut std::ffi::c_void,
        )?;
    }
    Ok(())
}

/// Whether cudarc allocates from the pool (it does where the device supports pools).
fn pools_supported(ctx: &CudaContext) -> Result<bool, CudaError> {
    use cudarc::driver::sys::CUdevice_attribute_enum::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
    Ok(ctx.attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? > 0)
}

/// Waits for the stream and returns the pool's unused memory to the driver, so `mem_get_info`
/// counts only live allocations.
pub fn trim_pool(dev: &Device) -> Result<(), CudaError> {
    use cudarc::driver::result;
    dev.stream.synchronize()?;
    if !pools_supported(&dev.ctx)? {
        return Ok(());
    }
    // SAFETY: the default pool of the context's device; nothing from it is in flight after
    // the synchronize, and trimming keeps every live allocation.
    unsafe {
        let pool = result::device::get_default_mem_pool(dev.ctx.cu_device())?;
        result::mem_pool::trim_to(pool, 0)?;
    }
    Ok(())
}

/// A grid-stride launch over `n` elements.
pub fn elementwise(n: usize) -> LaunchConfig {
    let threads = 256u32;
    let blocks = u32::try_from(n.div_ceil(threads as usize).clamp(1, 65_535 * 16)).unwrap_or(1);
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Threads for a block that loops over `work` items: a multiple of 32 (block reductions need
/// whole warps), about four items each, at most 1024. A lone decode row then spreads over
/// the block instead of queueing on a few threads.
pub fn threads_for(work: usize) -> u32 {
    u32::try_from((work.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024)).unwrap_or(1024)
}

/// Launches one block of `threads` per row; nothing for zero rows (a kernel would still
/// index row 0 of empty buffers).
///
/// # Safety
/// As `LaunchArgs::launch`: the arguments must match the kernel's signature and every row
/// index the kernel derives must be in bounds.
pub unsafe fn launch_rows(
    args: &mut LaunchArgs<'_>,
    rows: usize,
    threads: u32,
) -> Result<(), CudaError> {
    if rows == 0 {
        return Ok(());
    }
    let rows = crate::error::u32_arg("launch rows", rows)?;
    let cfg = LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the caller's contract.
    unsafe { args.launch(cfg) }?;
    Ok(())
}
