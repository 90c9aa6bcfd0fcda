//! Tensor parallelism (Megatron-LM's layout): every rank holds a slice of each layer's heads
//! and MLP columns and the forward all-reduces the two row-parallel outputs (o_proj, down_proj).
//! Rank 0 runs the scheduler and sends each step to the others (`step`), which run the same
//! executor headless. The collectives themselves come from existing software behind
//! `ProcessGroup` (MPI) and the backends (NCCL on CUDA); nothing here implements one.

mod shard;
mod step;

use std::sync::Arc;

pub use shard::{shard_packed, shard_weight};
pub use step::{run_worker, StepMessage, TpExecutor};

use crate::config::ModelConfig;
use crate::error::{InferError, Result};

/// The processes of one tensor-parallel group, from the launcher (MPI). Rank 0 is the one
/// that schedules. Every call is a collective: all ranks make it, in the same order.
pub trait ProcessGroup: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Rank 0's `data` on every rank (others pass `None`). `idle` marks the wait for the next
    /// step, which may last as long as the server is idle: it must not spin a core.
    fn broadcast(&self, data: Option<&[u8]>, idle: bool) -> Result<Vec<u8>>;
    /// Element-wise sum over ranks, in place.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()>;
    /// The smallest `value` over ranks (the KV pool every rank can hold).
    fn all_reduce_min(&self, value: u64) -> Result<u64>;
    /// Names the launcher in logs ("MPI (Open MPI 4.1.4)").
    fn describe(&self) -> String;
    /// Time this rank spent in the group's calls so far (benchmarks report it per step).
    fn stats(&self) -> CollectiveStats {
        CollectiveStats::default()
    }
}

/// Calls into the group and the wall time spent in them (waiting for slower ranks included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectiveStats {
    pub all_reduces: u64,
    pub all_reduce_time: std::time::Duration,
    /// Step hand-offs from rank 0 (not the idle wait for the next step).
    pub broadcasts: u64,
    pub broadcast_time: std::time::Duration,
}

/// This process's place in the tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorParallel {
    pub rank: usize,
    pub size: usize,
}

impl Default for TensorParallel {
    fn default() -> Self {
        TensorParallel::single()
    }
}

impl TensorParallel {
    pub fn single() -> Self {
        TensorParallel { rank: 0, size: 1 }
    }

    pub fn of(group: &Arc<dyn ProcessGroup>) -> Self {
        TensorParallel {
            rank: group.rank(),
            size: group.size(),
        }
    }

    pub fn is_parallel(&self) -> bool {
        self.size > 1
    }

    /// Refuses layouts that do not split evenly, naming the sizes (before any weight loads).
    /// KV heads either split (`kv_heads % tp == 0`) or are replicated (`tp % kv_heads == 0`,
    /// one KV head per rank, as vLLM does).
    pub fn check(&self, c: &ModelConfig) -> Result<()> {
        let tp = self.size;
        if tp == 0 || self.rank >= tp {
            return Err(InferError::Distributed(format!(
                "rank {} is outside a group of {tp}",
                self.rank
            )));
        }
        let refuse = |what: String| {
            Err(InferError::Distributed(format!(
                "tensor-parallel-size {tp} does not divide the model: {what}"
            )))
        };
        if !c.num_heads.is_multiple_of(tp) {
            return refuse(format!("{} attention heads", c.num_heads));
        }
        if !c.num_kv_heads.is_multiple_of(tp) && !tp.is_multiple_of(c.num_kv_heads) {
            return refuse(format!(
                "{} KV heads (neither a multiple of {tp} nor a divisor of it)",
                c.num_kv_heads
            ));
        }
        if !c.intermediate_size.is_multiple_of(tp) {
            return refuse(format!("intermediate size {}", c.intermediate_size));
        }
        if let Some(moe) = &c.features.moe {
            if !moe.expert_intermediate_size.is_multiple_of(tp) {
                return refuse(format!(
                    "expert intermediate size {}",
                    moe.expert_intermediate_size
                ));
            }
        }
        if tp > 1 && c.features.qk_norm == Some(crate::config::QkNorm::Whole) {
            return Err(InferError::Distributed(format!(
                "{} normalizes queries and keys over all heads at once, which tensor parallelism would split; run it with -tp 1",
                c.architecture
            )));
        }
        Ok(())
    }

    /// KV heads each rank holds: its share, or one replicated head when there are more
    /// ranks than KV heads.
    pub fn local_kv_heads(&self, c: &ModelConfig) -> usize {
        (c.num_kv_heads / self.size).max(1)
    }

    /// The first KV head this rank holds.
    fn first_kv_head(&self, c: &ModelConfig) -> usize {
        if c.num_kv_heads >= self.size {
            self.rank * c.num_kv_heads / self.size
        } else {
            // Ranks rank·kv/tp .. share a head: their query heads all map to it.
            self.rank / (self.size / c.num_kv_heads)
        }
    }

    /// The model as this rank computes it: its heads and MLP columns (hidden size, vocabulary
    /// and everything else unchanged). `check` must have passed.
    pub fn local_config(&self, c: &ModelConfig) -> ModelConfig {
        let mut local = c.clone();
        local.num_heads = c.num_heads / self.size;
        local.num_kv_heads = self.local_kv_heads(c);
        local.intermediate_size = c.intermediate_size / self.size;
        if let Some(moe) = &mut local.features.moe {
            moe.expert_intermediate_size /= self.size;
        }
        local
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(heads: usize, kv: usize, ff: usize) -> ModelConfig {
        ModelConfig::test_llama(heads, kv, 8, ff)
    }

    #[test]
    fn refuses_layouts_that_do_not_divide_naming_the_sizes() {
        let tp = |size| TensorParallel { rank: 0, size };
        let err = tp(2).check(&config(9, 3, 1536)).unwrap_err().to_string();
        assert!(err.contains("tensor-parallel-size 2") && err.contains("9 attention heads"));
        let err = tp(4).check(&config(12, 6, 64)).unwrap_err().to_string();
        assert!(err.contains("6 KV heads"), "{err}");
        let err = tp(3).check(&config(9, 3, 100)).unwrap_err().to_string();
        assert!(err.contains("intermediate size 100"), "{err}");
        tp(3).check(&config(9, 3, 1536)).unwrap();
        tp(4).check(&config(8, 2, 64)).unwrap();
    }

    #[test]
    fn kv_heads_split_or_replicate_so_query_heads_keep_their_group() {
        let c = config(8, 2, 64);
        for size in [1, 2, 4, 8] {
            for rank in 0..size {
                let tp = TensorParallel { rank, size };
                let local = tp.local_config(&c);
                local.validate().unwrap();
                // The query heads a rank holds must all read the KV heads it holds.
                let group = c.num_heads / c.num_kv_heads;
                let first_q = rank * local.num_heads;
                for q in first_q..first_q + local.num_heads {
                    let kv = q / group;
                    let first_kv = tp.first_kv_head(&c);
                    assert!(
                        (first_kv..first_kv + local.num_kv_heads).contains(&kv),
                        "size {size} rank {rank} q {q} kv {kv}"
                    );
                    let local_group = local.num_heads / local.num_kv_heads;
                    assert_eq!(first_kv + (q - first_q) / local_group, kv);
                }
            }
        }
    }
}
