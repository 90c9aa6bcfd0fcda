//! Rank 0 sends every step (block moves + batch metadata, postcard-encoded: a decode step of
//! 64 sequences is a few kB) to the other ranks, which run the same executor without the
//! logits; the all-reduces inside the forward keep the ranks in lock step.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ProcessGroup;
use crate::backend::PendingLogits;
use crate::batch::BatchInput;
use crate::engine::Executor;
use crate::error::{InferError, Result};
use crate::scheduler::CacheOps;

/// What rank 0 sends before each step (decoded once per step and dropped: the size of the
/// unboxed variant does not matter).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StepMessage {
    Step {
        ops: CacheOps,
        batch: Option<BatchInput>,
    },
    /// Rank 0 is done: workers return.
    Shutdown,
}

/// The borrowed form rank 0 encodes (serde writes `&T` as `T`: the bytes decode as
/// `StepMessage::Step`).
#[derive(Serialize)]
enum StepMessageRef<'a> {
    Step {
        ops: &'a CacheOps,
        batch: Option<&'a BatchInput>,
    },
}

impl StepMessage {
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        postcard::from_bytes(bytes)
            .map_err(|e| InferError::Distributed(format!("undecodable step message: {e}")))
    }

    pub fn encode(&self) -> Result<Vec<u8>> {
        encode(self)
    }
}

fn encode<T: Serialize>(m: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(m)
        .map_err(|e| InferError::Distributed(format!("encoding a step message: {e}")))
}

/// Rank 0's executor: sends each step to the group, then runs its own part. Dropping it
/// releases the workers.
pub struct TpExecutor<E: Executor> {
    local: E,
    group: Arc<dyn ProcessGroup>,
    shut_down: bool,
}

impl<E: Executor> TpExecutor<E> {
    pub fn new(local: E, group: Arc<dyn ProcessGroup>) -> Self {
        TpExecutor {
            local,
            group,
            shut_down: false,
        }
    }

    /// Tells the workers to return (also on drop).
    pub fn shutdown(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.shut_down, true) {
            return Ok(());
        }
        self.group
            .broadcast(Some(&StepMessage::Shutdown.encode()?), false)
            .map(drop)
    }
}

impl<E: Executor> Drop for TpExecutor<E> {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!("releasing the tensor-parallel workers: {e}");
        }
    }
}

impl<E: Executor> Executor for TpExecutor<E> {
    fn vocab_size(&self) -> usize {
        self.local.vocab_size()
    }

    fn submit(&mut self, ops: &CacheOps, batch: Option<&BatchInput>) -> Result<PendingLogits> {
        if self.shut_down {
            return Err(InferError::Distributed("the group was shut down".into()));
        }
        let bytes = encode(&StepMessageRef::Step { ops, batch })?;
        self.group.broadcast(Some(&bytes), false)?;
        self.local.submit(ops, batch)
    }

    fn wait(&self) -> Result<()> {
        self.local.wait()
    }

    fn sliding_window(&self) -> Option<usize> {
        self.local.sliding_window()
    }
}

/// A worker rank's loop: runs each step rank 0 sends on `executor` (built headless: no
/// logits) until it says stop. A step the executor refuses (a bad batch: rank 0 refused the
/// same one before any collective) is logged and the loop goes on; a failed collective ends it.
pub fn run_worker<E: Executor>(executor: &mut E, group: &dyn ProcessGroup) -> Result<()> {
    let rank = group.rank();
    loop {
        let bytes = group.broadcast(None, true)?;
        match StepMessage::decode(&bytes)? {
            StepMessage::Shutdown => {
                tracing::info!(rank, "rank 0 is done; worker exits");
                return Ok(());
            }
            StepMessage::Step { ops, batch } => {
                let done = executor
                    .submit(&ops, batch.as_ref())
                    .and_then(|pending| pending.wait(|| executor.wait()));
                match done {
                    Ok(_) => {}
                    Err(e @ InferError::Distributed(_)) => return Err(e),
                    Err(e) => tracing::warn!(rank, "step refused: {e}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borrowed_steps_decode_as_owned_ones() {
        let batch = BatchInput {
            token_ids: vec![5, 6, 7],
            positions: vec![0, 1, 2],
            slot_mapping: vec![16, 17, 18],
            query_start: vec![0, 3],
            context_lens: vec![3],
            block_tables: vec![1],
            max_blocks_per_seq: 1,
            block_size: 16,
            logits_indices: vec![2],
            argmax_only: true,
        };
        let ops = CacheOps {
            swap_out: vec![(1, 2)],
            swap_in: vec![],
            copy: vec![(3, 4)],
        };
        let bytes = encode(&StepMessageRef::Step {
            ops: &ops,
            batch: Some(&batch),
        })
        .unwrap();
        assert_eq!(
            StepMessage::decode(&bytes).unwrap(),
            StepMessage::Step {
                ops,
                batch: Some(batch)
            }
        );
        let stop = StepMessage::Shutdown.encode().unwrap();
        assert_eq!(StepMessage::decode(&stop).unwrap(), StepMessage::Shutdown);
        assert!(StepMessage::decode(&[0xff, 0xff]).is_err());
    }
}
