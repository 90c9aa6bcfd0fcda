//! Sizing the KV pool at start-up: whatever memory the weights and a worst-case step leave
//! becomes KV blocks (vLLM's profiling run). CPU backends cannot measure that, so they take
//! an explicit budget.

use tracing::{info, warn};

use crate::backend::{Backend, DeviceMemory};
use crate::batch::{BatchInput, SequenceChunk};
use crate::error::{InferError, Result};
use crate::model::Model;
use crate::narrow::u32_index;
use crate::scheduler::SchedulerConfig;

const GIB: f64 = (1u64 << 30) as f64;

/// Where the KV pool's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// An exact number of device blocks (`--num-kv-blocks`).
    Blocks(usize),
    /// Bytes for the pool (CPU: `--kv-cache-memory`).
    Bytes(u64),
    /// This fraction of the device memory left free after the weights and the profiling
    /// step's peak (`--gpu-memory-utilization`): on a shared GPU, other processes' memory
    /// is not ours to take.
    DeviceFraction(f64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPoolPlan {
    pub num_device_blocks: usize,
    pub num_host_blocks: usize,
    pub max_model_len: usize,
}

pub struct PoolRequest {
    pub budget: KvBudget,
    /// Host swap space in bytes (`--swap-space`).
    pub swap_bytes: u64,
    pub bytes_per_block: usize,
    pub block_size: usize,
    pub max_model_len: usize,
    /// The user asked for this `max_model_len`: refuse rather than lower it.
    pub max_model_len_is_explicit: bool,
}

/// Device memory once a worst-case step has run: `max_num_batched_tokens` tokens spread over
/// up to `max_num_seqs` prompts. `None` when the backend cannot report memory.
pub fn profile_step<B: Backend>(
    backend: &B,
    model: &Model<B>,
    scheduler: &SchedulerConfig,
    block_size: usize,
) -> Result<Option<DeviceMemory>> {
    if backend.device_memory().is_none() {
        return Ok(None);
    }
    let tokens = scheduler
        .max_num_batched_tokens
        .min(model.max_model_len() * scheduler.max_num_seqs);
    let seqs = scheduler.max_num_seqs.min(tokens).max(1);
    let per_seq = tokens.div_ceil(seqs).min(model.max_model_len());
    let blocks_per_seq = per_seq.div_ceil(block_size);
    let mut kv = backend.alloc_kv_cache(&model.kv_cache_spec(seqs * blocks_per_seq, block_size))?;
    let ids = vec![0u32; per_seq];
    let tables: Vec<Vec<u32>> = (0..seqs)
        .map(|s| {
            (s * blocks_per_seq..(s + 1) * blocks_per_seq)
                .map(u32_index)
                .collect()
        })
        .collect();
    let chunks: Vec<SequenceChunk> = tables
        .iter()
        .map(|t| SequenceChunk {
            tokens: &ids,
            num_computed: 0,
            block_table: t,
            want_logits: true,
            all_logits: false,
        })
        .collect();
    let batch = BatchInput::build(&chunks, block_size)?;
    let logits = model.forward(backend, &batch, &mut kv)?;
    backend.to_host(&logits)?;
    drop(kv);
    Ok(backend.device_memory())
}

/// Block ids are 32-bit: a pool larger than this (a 16 TiB cache of 4 KiB blocks) is capped.
pub const MAX_BLOCKS: u64 = u32::MAX as u64;

fn blocks_of(n: u64) -> usize {
    usize::try_from(n.min(MAX_BLOCKS)).unwrap_or(usize::MAX)
}

/// Turns the budget into block counts, checking that one sequence of `max_model_len` fits.
pub fn plan_kv_pool(req: &PoolRequest, profiled: Option<DeviceMemory>) -> Result<KvPoolPlan> {
    let per_block = req.bytes_per_block.max(1) as u64;
    let num_device_blocks = match req.budget {
        KvBudget::Blocks(n) => n,
        KvBudget::Bytes(b) => blocks_of(b / per_block),
        KvBudget::DeviceFraction(f) => {
            if !(f > 0.0 && f <= 1.0) {
                return Err(InferError::invalid(
                    "gpu_memory_utilization",
                    format!("{f} is not in (0, 1]"),
                ));
            }
            let Some(mem) = profiled else {
                return Err(InferError::invalid(
                    "gpu_memory_utilization",
                    "this backend cannot report device memory; give the KV pool size in blocks or bytes",
                ));
            };
            let left = mem.total_bytes.saturating_sub(mem.peak_used_bytes);
            // f is in (0, 1]: at most `left`.
            #[expect(clippy::cast_possible_truncation, reason = "at most `left`")]
            let free = (left as f64 * f) as u64;
            info!(
                "device memory {:.2} GiB, {:.2} GiB used after weights and a worst-case step; KV pool {f} × {:.2} GiB = {:.2} GiB",
                mem.total_bytes as f64 / GIB,
                mem.peak_used_bytes as f64 / GIB,
                left as f64 / GIB,
                free as f64 / GIB
            );
            blocks_of(free / per_block)
        }
    };
    let num_device_blocks = blocks_of(num_device_blocks as u64);
    let num_host_blocks = blocks_of(req.swap_bytes / per_block);
    let capacity = num_device_blocks * req.block_size;
    let mut max_model_len = req.max_model_len;
    if capacity < max_model_len {
        let needed = max_model_len.div_ceil(req.block_size);
        let what = format!(
            "one sequence of max_model_len {max_model_len} needs {needed} KV blocks ({:.2} GiB) but the pool holds {num_device_blocks} ({:.2} GiB)",
            (needed as u64 * per_block) as f64 / GIB,
            (num_device_blocks as u64 * per_block) as f64 / GIB,
        );
        if req.max_model_len_is_explicit || capacity == 0 {
            return Err(InferError::KvCache(format!(
                "{what}; the largest max_model_len that fits is {capacity}: lower it or give the pool more memory"
            )));
        }
        warn!("{what}; lowering max_model_len to {capacity}");
        max_model_len = capacity;
    }
    info!(
        "KV pool: {num_device_blocks} device blocks of {} tokens ({:.2} GiB), {num_host_blocks} host blocks for swapping",
        req.block_size,
        (num_device_blocks as u64 * per_block) as f64 / GIB
    );
    Ok(KvPoolPlan {
        num_device_blocks,
        num_host_blocks,
        max_model_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(budget: KvBudget, explicit: bool) -> PoolRequest {
        PoolRequest {
            budget,
            swap_bytes: 4096,
            bytes_per_block: 1024,
            block_size: 16,
            max_model_len: 2048,
            max_model_len_is_explicit: explicit,
        }
    }

    #[test]
    fn bytes_become_blocks_and_a_short_pool_lowers_or_refuses() {
        let p = plan_kv_pool(&req(KvBudget::Bytes(1 << 20), false), None).unwrap();
        assert_eq!(
            (p.num_device_blocks, p.num_host_blocks, p.max_model_len),
            (1024, 4, 2048)
        );
        // 64 blocks hold 1024 tokens: lowered when implicit, refused with the fitting length.
        let p = plan_kv_pool(&req(KvBudget::Blocks(64), false), None).unwrap();
        assert_eq!(p.max_model_len, 1024);
        let e = plan_kv_pool(&req(KvBudget::Blocks(64), true), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("largest max_model_len that fits is 1024"),
            "{e}"
        );
    }

    #[test]
    fn device_fraction_takes_a_share_of_what_the_profiled_step_left() {
        let mem = DeviceMemory {
            total_bytes: 1 << 30,
            peak_used_bytes: 1 << 29,
        };
        // 0.75 of the 512 MiB left, not 0.75 of the total minus the used part.
        let p = plan_kv_pool(&req(KvBudget::DeviceFraction(0.75), false), Some(mem)).unwrap();
        assert_eq!(p.num_device_blocks, (3 << 27) / 1024);
        assert!(plan_kv_pool(&req(KvBudget::DeviceFraction(0.75), false), None).is_err());
        assert!(plan_kv_pool(&req(KvBudget::DeviceFraction(1.5), false), Some(mem)).is_err());
    }
}
