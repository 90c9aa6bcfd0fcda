//! Executors run a scheduled step: the block moves, then the forward. The engine above them
//! knows nothing of devices; `ModelExecutor` runs the real model on any backend.

use std::sync::Arc;

use crate::backend::{Backend, PendingLogits, StepLogits};
use crate::batch::BatchInput;
use crate::error::{InferError, Result};
use crate::model::Model;
use crate::scheduler::CacheOps;
use crate::weights::HostTensor;

pub trait Executor {
    /// Length of a logits row.
    fn vocab_size(&self) -> usize;
    /// Performs `ops` (swap out, swap in, copy, in that order), then submits `batch` if there
    /// is one and returns the read-back of its `batch.logits_indices.len()` logits rows (or
    /// their argmaxes), which may still be in flight.
    fn submit(&mut self, ops: &CacheOps, batch: Option<&BatchInput>) -> Result<PendingLogits>;
    /// Blocks until the submitted work and its read-back are done (native engines call it
    /// through `PendingLogits::wait`; the browser awaits the read instead).
    fn wait(&self) -> Result<()> {
        Ok(())
    }
    /// The attention window of every layer, when all of them slide (Mistral): the engine
    /// then frees blocks that have left it. `None` keeps every block.
    fn sliding_window(&self) -> Option<usize> {
        None
    }
    /// Runs `batch` and returns, on the host, the final-normed hidden states of the rows
    /// `batch.logits_indices` names instead of logits (a pooling model's step).
    fn hidden_rows(&mut self, _batch: &BatchInput) -> Result<HostTensor> {
        Err(InferError::invalid(
            "runner",
            "this engine computes logits only; pooling needs a single-device model",
        ))
    }
}

/// Engines over any backend behind one type (the CLI picks the backend at run time).
impl Executor for Box<dyn Executor> {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn submit(&mut self, ops: &CacheOps, batch: Option<&BatchInput>) -> Result<PendingLogits> {
        (**self).submit(ops, batch)
    }

    fn wait(&self) -> Result<()> {
        (**self).wait()
    }

    fn sliding_window(&self) -> Option<usize> {
        (**self).sliding_window()
    }

    fn hidden_rows(&mut self, batch: &BatchInput) -> Result<HostTensor> {
        (**self).hidden_rows(batch)
    }
}

/// A Llama-family model on a backend, with the device KV pool and the host swap space.
pub struct ModelExecutor<B: Backend> {
    backend: B,
    model: Arc<Model<B>>,
    kv: B::KvCache,
    swap: B::SwapSpace,
    /// False on tensor-parallel workers: they run the layers and leave the logits to rank 0.
    logits: bool,
}

impl<B: Backend> ModelExecutor<B> {
    pub fn new(
        backend: B,
        model: Arc<Model<B>>,
        block_size: usize,
        num_device_blocks: usize,
        num_host_blocks: usize,
    ) -> Result<Self> {
        let kv = backend.alloc_kv_cache(&model.kv_cache_spec(num_device_blocks, block_size))?;
        let swap = backend.alloc_swap_space(&model.kv_cache_spec(num_host_blocks, block_size))?;
        Ok(ModelExecutor {
            backend,
            model,
            kv,
            swap,
            logits: true,
        })
    }

    /// An executor that runs every layer but computes no logits (a tensor-parallel worker).
    pub fn headless(self) -> Self {
        ModelExecutor {
            logits: false,
            ..self
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
}

impl<B: Backend> Executor for ModelExecutor<B> {
    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn submit(&mut self, ops: &CacheOps, batch: Option<&BatchInput>) -> Result<PendingLogits> {
        let b = &self.backend;
        if !ops.swap_out.is_empty() {
            b.swap_out(&self.kv, &mut self.swap, &ops.swap_out)?;
        }
        if !ops.swap_in.is_empty() {
            b.swap_in(&self.swap, &mut self.kv, &ops.swap_in)?;
        }
        if !ops.copy.is_empty() {
            b.copy_blocks(&mut self.kv, &ops.copy)?;
        }
        let nothing = PendingLogits::Ready(StepLogits::default());
        let Some(batch) = batch else {
            return Ok(nothing);
        };
        // Workers leave the logits to rank 0; a step of non-final prefill chunks wants none.
        if !self.logits || batch.logits_indices.is_empty() {
            self.model.forward_hidden(b, batch, &mut self.kv)?;
            return Ok(nothing);
        }
        let logits = self.model.forward(b, batch, &mut self.kv)?;
        b.read_logits(&logits, batch.argmax_only)
    }

    fn wait(&self) -> Result<()> {
        self.backend.wait_device()
    }

    fn sliding_window(&self) -> Option<usize> {
        let c = self.model.config();
        c.features.sliding_window.filter(|_| c.all_layers_slide())
    }

    fn hidden_rows(&mut self, batch: &BatchInput) -> Result<HostTensor> {
        // A tensor-parallel worker's ranks would each need the same step.
        if !self.logits || self.model.tensor_parallel().is_parallel() {
            return Err(InferError::invalid(
                "runner",
                "pooling runs on one device (no tensor parallelism)",
            ));
        }
        self.model
            .forward_normed_rows(&self.backend, batch, &mut self.kv)
    }
}
