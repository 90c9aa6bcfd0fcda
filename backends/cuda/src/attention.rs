//! PagedAttention on CUDA: the partitioned kernel (one block per head, token and 512-key
//! partition) then the reduction over partitions.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use infer_core::backend::AttentionParams;
use infer_core::error::Result;
use infer_core::BackendError;

use crate::backend::CudaBackend;
use crate::batch::CudaBatch;
use crate::cache::CudaKvCache;
use crate::error::u32_arg;
use crate::error::{cuda_err, CudaError};
use crate::kernels::{ATTENTION_PARTITION, ATTENTION_THREADS, MAX_HEAD_DIM};
use crate::tensor::{CudaTensor, Storage};

pub fn paged_attention(
    be: &CudaBackend,
    q: &CudaTensor,
    cache: &CudaKvCache,
    layer: usize,
    batch: &CudaBatch,
    p: &AttentionParams,
    sinks: Option<&CudaTensor>,
) -> Result<CudaTensor> {
    if let Some(s) = sinks.filter(|s| s.len() != p.num_heads) {
        let e = BackendError::count("paged_attention", "sinks", s.len(), p.num_heads);
        return Err(cuda_err(e));
    }
    let spec = cache.spec;
    let n = batch.input.num_tokens();
    let width = p.num_heads * p.head_dim;
    let bad = q.len() != n * width
        || layer >= cache.layers.len()
        || p.num_kv_heads == 0
        || !p.num_heads.is_multiple_of(p.num_kv_heads)
        || p.num_kv_heads != spec.num_kv_heads
        || p.head_dim != spec.head_dim
        || p.head_dim > MAX_HEAD_DIM
        || batch.input.block_size != spec.block_size;
    if bad {
        return Err(cuda_err(BackendError::shape(
            "paged_attention",
            &[("q", &q.shape)],
            format!(
                "q [{n} tokens, {} heads × {} (≤ {MAX_HEAD_DIM})] with {p:?} over {spec:?}, \
                 layer {layer} of {}",
                p.num_heads,
                p.head_dim,
                cache.layers.len()
            ),
        )));
    }
    // Every block a token can read must be inside the cache.
    let max_blocks = batch.input.max_blocks_per_seq;
    if let Some(b) = batch.max_block.filter(|&b| b as usize >= spec.num_blocks) {
        let e = BackendError::out_of_range("paged_attention", "block", b, spec.num_blocks);
        return Err(cuda_err(e));
    }
    if batch.max_context > max_blocks * spec.block_size {
        return Err(cuda_err(BackendError::too_large(
            "paged_attention",
            "context tokens (the block tables' reach)",
            batch.max_context as u64,
            (max_blocks * spec.block_size) as u64,
        )));
    }
    // Both kernels write every element of their outputs: no memsets (four launches a layer).
    let mut out = be.output_f32(n * width)?;
    if n == 0 {
        return Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: vec![0, width],
        });
    }
    let parts = batch.attention_parts;
    if parts * ATTENTION_PARTITION < batch.max_context {
        return Err(cuda_err(BackendError::too_large(
            "paged_attention",
            "context tokens (the partitions' reach)",
            batch.max_context as u64,
            (parts * ATTENTION_PARTITION) as u64,
        )));
    }
    let partials = n * p.num_heads * parts;
    let mut part_out = be.output_f32(partials * p.head_dim)?;
    let mut part_max = be.output_f32(partials)?;
    let mut part_sum = be.output_f32(partials)?;
    let (kc, vc) = &cache.layers[layer];
    let a = |v: usize| u32_arg("paged_attention", v);
    let (mb, bs, h, kvh, hd) = (
        a(max_blocks.max(1))?,
        a(spec.block_size)?,
        a(p.num_heads)?,
        a(p.num_kv_heads)?,
        a(p.head_dim)?,
    );
    // 0: no window, no soft-cap.
    let window = a(p.window.unwrap_or(0))?;
    let softcap = p.softcap.unwrap_or(0.0);
    let s = &be.dev.stream;
    let mut b = s.launch_builder(be.dev.function("paged_attention")?);
    b.arg(q.f32("paged_attention")?).arg(kc).arg(vc);
    b.arg(&batch.token_seq)
        .arg(&batch.positions)
        .arg(&batch.block_tables);
    b.arg(&mb).arg(&bs).arg(&h).arg(&kvh).arg(&hd).arg(&p.scale);
    b.arg(&window).arg(&softcap);
    b.arg(&mut part_out).arg(&mut part_max).arg(&mut part_sum);
    let cfg = LaunchConfig {
        grid_dim: (h, a(n)?, a(parts)?),
        block_dim: (ATTENTION_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel's signature is matched argument by argument; block ids were checked
    // against the cache, every token's context against its block table, head_dim against the
    // kernel's shared buffer, and the partial buffers hold tokens * heads * parts entries.
    unsafe { b.launch(cfg) }.map_err(CudaError::from)?;

    let mut b = s.launch_builder(be.dev.function("attention_reduce")?);
    let parts32 = a(parts)?;
    b.arg(&part_out).arg(&part_max).arg(&part_sum).arg(&mut out);
    b.arg(&h).arg(&hd).arg(&parts32);
    // Without sinks the pointer is any buffer: the kernel does not read it.
    let has_sinks = u32::from(sinks.is_some());
    match sinks {
        Some(s) => b.arg(s.f32("paged_attention")?),
        None => b.arg(&part_max),
    };
    b.arg(&has_sinks);
    let cfg = LaunchConfig {
        grid_dim: (h, a(n)?, 1),
        block_dim: (64, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: attention_reduce(const float* x3, float*, u32, u32, u32, const float*, u32)
    // over the partials written above; `out` holds tokens * heads * head_dim, sinks (read only
    // with has_sinks) one per head.
    unsafe { b.launch(cfg) }.map_err(CudaError::from)?;
    Ok(CudaTensor {
        storage: Storage::F32(out),
        shape: vec![n, width],
    })
}
