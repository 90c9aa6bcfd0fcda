//! CUDA graphs for decode steps, as vLLM captures them: a decode step launches some fifteen
//! kernels a layer, and at batch 1 the host's launches, not the GPU, set the pace. A step of
//! `n` one-token sequences is padded to the next captured size (`BUCKETS`), the first step of
//! a shape runs eagerly (a warm-up that also tells the logits' width), the second is captured
//! and every later one replays the recording after copying its metadata (tokens, positions,
//! slots, block tables) into the recording's fixed device buffers. Padding tokens write no
//! KV (`PAD_SLOT`) and their logits rows are dropped. A shape whose capture fails (an op that
//! reads back mid-step, like MoE routing) runs eagerly from then on; `--enforce-eager` turns
//! graphs off.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};
use infer_core::batch::BatchInput;
use infer_core::error::Result;
use infer_core::BackendError;

use super::CudaBackend;
use crate::batch::CudaBatch;
use crate::cache::CudaKvCache;
use crate::error::CudaError;
use crate::kernels::ATTENTION_PARTITION;
use crate::tensor::{CudaTensor, Storage};

/// The slot of a padding token: `write_kv` skips it.
pub const PAD_SLOT: u32 = u32::MAX;

/// Decode batch sizes recorded (vLLM's spacing: every size up to 4, then steps of 8, 16, 32
/// and 64); a step of `n` sequences replays the smallest size ≥ n.
const BUCKETS: [usize; 23] = [
    1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448,
    512,
];

/// The default largest decode batch recorded (vLLM's `--max-cudagraph-capture-size`).
pub const DEFAULT_MAX_CAPTURE: usize = 512;

/// A step's forward pass (`Backend::run_step`).
pub type BodyFn<'a> = dyn FnMut(&CudaBatch, &mut CudaKvCache) -> Result<CudaTensor> + 'a;

/// The recorded decode steps of one backend, by shape.
#[derive(Default)]
pub struct StepGraphs {
    /// Largest decode batch recorded; 0 runs every step eagerly.
    max_rows: usize,
    entries: Mutex<HashMap<GraphKey, Entry>>,
    captures: AtomicU64,
    replays: AtomicU64,
}

/// What a recording is specific to: the cache it reads and writes (each model has its own),
/// the padded batch size, and the attention partitions (a power of two, so a growing context
/// needs few recordings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct GraphKey {
    cache: u64,
    rows: usize,
    parts: usize,
}

enum Entry {
    /// Run once, eagerly: the logits' width, so the next step of the shape can be recorded.
    Seen {
        cols: usize,
    },
    Recorded(Box<Recording>),
    /// Recording failed: this shape always runs eagerly.
    Eager,
}

struct Recording {
    graph: CudaGraph,
    /// The fixed metadata buffers the graph reads (a step's are copied in before a replay).
    batch: CudaBatch,
    /// `[rows, cols]`: where the graph leaves the logits.
    logits: CudaSlice<f32>,
    cols: usize,
}

// SAFETY: a graph's handles are only touched under `StepGraphs::entries`' lock, the external
// serialization CUDA asks of graph objects; the stream they launch on is the backend's.
unsafe impl Send for Recording {}

impl StepGraphs {
    pub fn new(max_rows: usize) -> Self {
        StepGraphs {
            max_rows,
            ..Default::default()
        }
    }

    /// (shapes recorded, steps replayed) so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.captures.load(Ordering::Relaxed),
            self.replays.load(Ordering::Relaxed),
        )
    }

    /// The padded size and partitions of a decode step (every sequence one token, every
    /// token's logits) that graphs can take.
    fn key(&self, b: &BatchInput, cache: &CudaKvCache) -> Option<GraphKey> {
        let n = b.num_tokens();
        let decode = n > 0
            && b.num_seqs() == n
            && b.logits_indices.len() == n
            && b.logits_indices
                .iter()
                .enumerate()
                .all(|(i, &r)| r as usize == i);
        if !decode {
            return None;
        }
        let rows = *BUCKETS.iter().find(|&&r| r >= n && r <= self.max_rows)?;
        let context = b.positions.iter().map(|&p| p as usize + 1).max()?;
        let parts = context.div_ceil(ATTENTION_PARTITION).next_power_of_two();
        Some(GraphKey {
            cache: cache.id,
            rows,
            parts,
        })
    }
}

/// `b` padded to `rows` tokens (one a sequence) and block tables `width` wide, or `None`
/// when a slot or block is outside the cache: the eager path then reports it.
fn pad(b: &BatchInput, rows: usize, width: usize, cache: &CudaKvCache) -> Option<BatchInput> {
    let n = b.num_tokens();
    let spec = cache.spec;
    if b.block_size != spec.block_size
        || b.slot_mapping
            .iter()
            .any(|&s| s as usize >= spec.num_blocks * spec.block_size)
    {
        return None;
    }
    let mut block_tables = vec![0u32; rows * width];
    for seq in 0..n {
        // Only the blocks the context covers are read (it fits `width` by the key's choice).
        let ctx = b.context_lens[seq] as usize;
        let used = ctx.div_ceil(b.block_size);
        let table = b.block_table(seq);
        if used > width || used > table.len() {
            return None;
        }
        block_tables[seq * width..seq * width + used].copy_from_slice(&table[..used]);
    }
    if block_tables
        .iter()
        .any(|&id| id as usize >= spec.num_blocks)
    {
        return None;
    }
    let padded = |v: &[u32], fill: u32| {
        let mut p = v.to_vec();
        p.resize(rows, fill);
        p
    };
    Some(BatchInput {
        token_ids: padded(&b.token_ids, 0),
        positions: padded(&b.positions, 0),
        slot_mapping: padded(&b.slot_mapping, PAD_SLOT),
        query_start: (0u32..).take(rows + 1).collect(),
        context_lens: padded(&b.context_lens, 1),
        block_tables,
        max_blocks_per_seq: width,
        block_size: b.block_size,
        logits_indices: (0u32..).take(rows).collect(),
        argmax_only: b.argmax_only,
    })
}

impl CudaBackend {
    /// `Backend::run_step`: decode steps through recorded graphs where possible.
    pub(crate) fn run_step_graphed(
        &self,
        batch: &BatchInput,
        kv: &mut CudaKvCache,
        body: &mut BodyFn<'_>,
    ) -> Result<CudaTensor> {
        use infer_core::Backend;
        let key = match self.graphs.key(batch, kv) {
            Some(key) if self.nccl.is_none() => key,
            // Prefill, mixed and speculative-verify steps, tensor-parallel ranks.
            _ => return body(&self.upload_batch(batch)?, kv),
        };
        let width = (key.parts * ATTENTION_PARTITION).div_ceil(batch.block_size);
        let Some(padded) = pad(batch, key.rows, width, kv) else {
            return body(&self.upload_batch(batch)?, kv);
        };
        let n = batch.num_tokens();
        let mut entries = self
            .graphs
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match entries.get_mut(&key) {
            None => {
                let logits = body(&self.upload_batch(batch)?, kv)?;
                let cols = logits.rows_cols().1;
                entries.insert(key, Entry::Seen { cols });
                Ok(logits)
            }
            Some(Entry::Eager) => body(&self.upload_batch(batch)?, kv),
            Some(Entry::Recorded(rec)) => match self.replay(rec, &padded, n) {
                Ok(logits) => Ok(logits),
                Err(e) => {
                    tracing::warn!(rows = key.rows, error = %e, "CUDA graph replay failed; running this shape eagerly");
                    entries.insert(key, Entry::Eager);
                    body(&self.upload_batch(batch)?, kv)
                }
            },
            Some(&mut Entry::Seen { cols }) => match self.record(&padded, key, cols, kv, body) {
                Ok(mut rec) => {
                    self.graphs.captures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        rows = key.rows,
                        parts = key.parts,
                        "decode step recorded as a CUDA graph"
                    );
                    let logits = self.replay(&mut rec, &padded, n);
                    entries.insert(key, Entry::Recorded(rec));
                    Ok(logits?)
                }
                Err(e) => {
                    tracing::warn!(rows = key.rows, error = %e, "recording a CUDA graph failed; running this shape eagerly");
                    entries.insert(key, Entry::Eager);
                    body(&self.upload_batch(batch)?, kv)
                }
            },
        }
    }

    /// Records `body` over fixed buffers holding `padded`; nothing runs until a replay.
    fn record(
        &self,
        padded: &BatchInput,
        key: GraphKey,
        cols: usize,
        kv: &mut CudaKvCache,
        body: &mut BodyFn<'_>,
    ) -> std::result::Result<Box<Recording>, String> {
        let s = &self.dev.stream;
        let fixed = |v: &[u32]| s.clone_htod(v).map_err(|e| e.to_string());
        let batch = CudaBatch {
            token_ids: fixed(&padded.token_ids)?,
            positions: fixed(&padded.positions)?,
            slots: fixed(&padded.slot_mapping)?,
            token_seq: fixed(&padded.token_seqs())?,
            block_tables: fixed(&padded.block_tables)?,
            logits_indices: fixed(&padded.logits_indices)?,
            max_context: padded
                .positions
                .iter()
                .map(|&p| p as usize + 1)
                .max()
                .unwrap_or(1),
            // The key's partitions, enough for every step that replays the recording.
            attention_parts: key.parts,
            max_slot: padded
                .slot_mapping
                .iter()
                .copied()
                .filter(|&s| s != PAD_SLOT)
                .max(),
            max_block: padded.block_tables.iter().copied().max(),
            input: padded.clone(),
        };
        let len = key.rows * cols;
        let mut logits = s.alloc_zeros::<f32>(len).map_err(|e| e.to_string())?;
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| e.to_string())?;
        // Every tensor `body` allocates is freed inside the capture, so the graph owns its
        // memory; only the copy into `logits` leaves it.
        let ran = body(&batch, kv)
            .map_err(|e| e.to_string())
            .and_then(|out| match &out.storage {
                Storage::F32(o) if out.len() == len && o.len() >= len => s
                    .memcpy_dtod(&o.slice(0..len), &mut logits)
                    .map_err(|e| e.to_string()),
                _ => Err(format!(
                    "logits {:?}, expected [{}, {cols}]",
                    out.shape, key.rows
                )),
            });
        let graph = s.end_capture(CUgraphInstantiate_flags(0));
        // Frees of buffers made inside a failed capture are recorded on the context, not
        // returned: clear them so they do not surface in a later, unrelated call.
        let _ = self.dev.ctx.check_err();
        ran?;
        match graph {
            Ok(Some(graph)) => Ok(Box::new(Recording {
                graph,
                batch,
                logits,
                cols,
            })),
            Ok(None) => Err("the capture recorded nothing".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Copies the step's metadata into the recording's buffers, replays it and returns the
    /// first `n` rows of its logits.
    fn replay(
        &self,
        rec: &mut Recording,
        padded: &BatchInput,
        n: usize,
    ) -> std::result::Result<CudaTensor, CudaError> {
        let s = &self.dev.stream;
        let b = &mut rec.batch;
        // The token→sequence map and the logits rows are the same every step.
        s.memcpy_htod(&padded.token_ids, &mut b.token_ids)?;
        s.memcpy_htod(&padded.positions, &mut b.positions)?;
        s.memcpy_htod(&padded.slot_mapping, &mut b.slots)?;
        if padded.block_tables.len() != b.block_tables.len() {
            let (got, want) = (padded.block_tables.len(), b.block_tables.len());
            return Err(BackendError::count("cuda graph", "block table entries", got, want).into());
        }
        s.memcpy_htod(&padded.block_tables, &mut b.block_tables)?;
        rec.graph.launch()?;
        self.graphs.replays.fetch_add(1, Ordering::Relaxed);
        let len = n * rec.cols;
        let mut out = self.output_f32(len)?;
        s.memcpy_dtod(&rec.logits.slice(0..len), &mut out)?;
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: vec![n, rec.cols],
        })
    }
}
