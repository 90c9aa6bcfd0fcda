//! The CUDA C kernels, compiled at run time by NVRTC for the device's architecture, once per
//! process and architecture. Sources are plain `.cu` files in `kernels/`, each compiled with
//! `common.cuh` in front (no toolkit headers needed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use crate::error::CudaError;

const COMMON: &str = include_str!("../kernels/common.cuh");

/// (file, source, kernels it defines).
pub const SOURCES: &[(&str, &str, &[&str])] = &[
    (
        "elementwise.cu",
        include_str!("../kernels/elementwise.cu"),
        &[
            "add_assign",
            "add_bias",
            "silu_mul",
            "gelu_tanh_mul",
            "swiglu_clamped",
            "scale",
            "softcap",
            "cast_f32_f16",
            "gather_rows",
        ],
    ),
    (
        "rms_norm.cu",
        include_str!("../kernels/rms_norm.cu"),
        &["rms_norm", "add_rms_norm"],
    ),
    ("rope.cu", include_str!("../kernels/rope.cu"), &["rope"]),
    (
        "embedding.cu",
        include_str!("../kernels/embedding.cu"),
        &["embedding_f16", "embedding_f32"],
    ),
    (
        "kv_cache.cu",
        include_str!("../kernels/kv_cache.cu"),
        &["write_kv", "copy_blocks"],
    ),
    (
        "paged_attention.cu",
        include_str!("../kernels/paged_attention.cu"),
        &["paged_attention", "attention_reduce"],
    ),
    (
        "moe.cu",
        include_str!("../kernels/moe.cu"),
        &[
            "moe_route",
            "moe_group",
            "moe_matmul_f32",
            "moe_matmul_f16",
            "moe_combine",
            "moe_add_bias",
        ],
    ),
    (
        "quant.cu",
        include_str!("../kernels/quant.cu"),
        &[
            "matvec_f16",
            "quantize_q8_1",
            "matvec_q8_q8_0",
            "dequant_q8_0",
            "embedding_q8_0",
            "matvec_q8_q4_0",
            "dequant_q4_0",
            "embedding_q4_0",
            "matvec_q8_q4_1",
            "dequant_q4_1",
            "embedding_q4_1",
            "matvec_q8_q4_k",
            "dequant_q4_k",
            "embedding_q4_k",
            "matvec_q8_q5_k",
            "dequant_q5_k",
            "embedding_q5_k",
            "matvec_q8_q6_k",
            "dequant_q6_k",
            "embedding_q6_k",
        ],
    ),
    (
        "argmax.cu",
        include_str!("../kernels/argmax.cu"),
        &["argmax"],
    ),
];

/// Keys per attention partition (`PARTITION` in paged_attention.cu).
pub const ATTENTION_PARTITION: usize = 512;
/// Most experts the grouping kernel's shared memory holds (`MOE_MAX_EXPERTS` in moe.cu).
pub const MOE_MAX_EXPERTS: usize = 4096;
/// Threads of an attention block (`32 * ATTENTION_WARPS` in paged_attention.cu).
pub const ATTENTION_THREADS: u32 = 256;
/// Largest head dimension the attention kernel's shared memory holds.
pub const MAX_HEAD_DIM: usize = 256;

/// NVRTC is loaded at run time; cudarc panics when it is missing, so look first.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library by its usual names; loads nothing into CUDA.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles one kernel file to PTX for `compute_{major}{minor}`.
pub fn compile(file: &str, source: &str, arch: (i32, i32)) -> Result<Ptx, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::Unavailable(
            "libnvrtc.so not found (install the CUDA toolkit's NVRTC or put it on LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    let opts = CompileOptions {
        options: vec![
            format!("--gpu-architecture=compute_{}{}", arch.0, arch.1),
            "--std=c++17".into(),
        ],
        name: Some(file.to_string()),
        ..Default::default()
    };
    let src = format!("{COMMON}\n{source}");
    compile_ptx_with_opts(src, opts).map_err(|e| CudaError::Compile {
        file: file.to_string(),
        log: match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => other.to_string(),
        },
    })
}

type PtxSet = Arc<Vec<(&'static str, Ptx)>>;

/// Every kernel file's PTX for `arch`, compiled on first use and kept for the process.
pub fn compiled(arch: (i32, i32)) -> Result<PtxSet, CudaError> {
    static CACHE: OnceLock<Mutex<HashMap<(i32, i32), PtxSet>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(set) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&arch) {
        return Ok(set.clone());
    }
    let start = std::time::Instant::now();
    let set: Vec<_> = SOURCES
        .iter()
        .map(|(file, src, _)| Ok((*file, compile(file, src, arch)?)))
        .collect::<Result<_, CudaError>>()?;
    tracing::info!(
        arch = format!("sm_{}{}", arch.0, arch.1),
        ms = infer_core::narrow::u64_saturating(start.elapsed().as_millis()),
        "compiled CUDA kernels with NVRTC"
    );
    let set = Arc::new(set);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(arch, set.clone());
    Ok(set)
}
