//! The op-level backend trait. The decoder forward (`model::decoder`) is written once against it;
//! the CPU, wgpu and CUDA backends implement it. Ops may enqueue work; `to_host` is the sync
//! point, and `read_logits` the step's one read-back, which may complete later (the browser
//! cannot block on the GPU). Batch metadata is passed explicitly (uploaded once per step as
//! `Self::Batch`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::batch::BatchInput;
use crate::block_manager::BlockCopy;
use crate::config::RopeStyle;
use crate::error::Result;
use crate::moe::{HostRouting, MoeRouting};
use crate::weights::{HostTensor, PackedTensor};

/// What a step leaves for sampling: the logits rows, or, when the batch asked only for argmaxes
/// (`BatchInput::argmax_only`) and the backend computed them where the logits live, one id
/// per row.
#[derive(Debug, Default)]
pub struct StepLogits {
    /// `[rows * vocab]`.
    pub rows: Vec<f32>,
    pub argmax: Option<Vec<u32>>,
}

impl StepLogits {
    pub fn clear(&mut self) {
        self.rows.clear();
        self.argmax = None;
    }
}

/// A step's read-back: already on the host, or a future that completes once the device has
/// finished the step. Natively the device is driven by `Backend::wait_device` (then the result
/// is there at once); in the browser by its event loop, so the caller awaits it.
pub enum PendingLogits {
    Ready(StepLogits),
    InFlight(Pin<Box<dyn Future<Output = Result<StepLogits>>>>),
}

impl PendingLogits {
    /// Blocks for the result (native): `drive` waits for the device, then the read is polled.
    /// Another thread polling the same device may run the read's completion a moment after
    /// the device is idle, so this drives and polls again until it is there; still pending
    /// after 30 s is an error, never a hang.
    pub fn wait(self, mut drive: impl FnMut() -> Result<()>) -> Result<StepLogits> {
        let mut f = match self {
            PendingLogits::Ready(l) => return Ok(l),
            PendingLogits::InFlight(f) => f,
        };
        let deadline = web_time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            drive()?;
            if let Poll::Ready(r) = f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                return r;
            }
            if web_time::Instant::now() >= deadline {
                return Err(crate::error::BackendError::device(
                    "read_logits",
                    "the step's read-back had not completed 30 s after the device was idle",
                )
                .on("device"));
            }
            std::thread::yield_now();
        }
    }

    /// Awaits the result (the browser: the event loop completes the mapping).
    pub async fn resolve(self) -> Result<StepLogits> {
        match self {
            PendingLogits::Ready(l) => Ok(l),
            PendingLogits::InFlight(f) => f.await,
        }
    }
}

/// A tensor living in the backend's memory.
pub trait DeviceTensor {
    /// Row-major shape.
    fn shape(&self) -> &[usize];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheSpec {
    pub num_layers: usize,
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvCacheSpec {
    /// Bytes one block takes across all layers, K and V, at `bytes_per_elem`.
    pub fn bytes_per_block(&self, bytes_per_elem: usize) -> usize {
        2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * bytes_per_elem
    }
}

/// What the device holds and what the process has used at most so far (weights, activations
/// of the profiling step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    pub total_bytes: u64,
    pub peak_used_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Softmax scale, usually `1/sqrt(head_dim)`.
    pub scale: f32,
    /// A query at position p sees only keys p - W + 1 ..= p (sliding-window layers).
    pub window: Option<usize>,
    /// Scores (after `scale`) become `cap · tanh(s / cap)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
}

pub trait Backend {
    type Tensor: DeviceTensor;
    /// Per-step batch metadata in device memory.
    type Batch;
    /// The paged KV cache of every layer (the layout is the backend's choice).
    type KvCache;
    /// Host memory that preempted sequences' blocks are swapped to, laid out like `KvCache`.
    type SwapSpace;
    /// One layer's routing of a step's tokens to experts (`moe::HostRouting` is its host
    /// form), kept where the backend computes.
    type Routing;

    /// Names the backend and device in logs (e.g. "cpu (2 threads)").
    fn name(&self) -> String;

    /// Copies a host tensor (weights, tables) into backend memory.
    fn upload(&self, tensor: &HostTensor) -> Result<Self::Tensor>;
    /// Takes a block-quantized weight as stored, for backends whose `matmul` (and `embedding`)
    /// compute on such blocks directly. `None` (the default) makes the loader dequantize it to
    /// f32 and call `upload` instead.
    fn upload_packed(&self, _tensor: &PackedTensor) -> Result<Option<Self::Tensor>> {
        Ok(None)
    }
    /// Uploads a weight matrix `[rows, cols]` (used by `matmul` or `embedding` only), which a
    /// backend may store in a narrower type; the default is `upload`.
    fn upload_matrix(&self, tensor: &HostTensor) -> Result<Self::Tensor> {
        self.upload(tensor)
    }
    fn upload_batch(&self, batch: &BatchInput) -> Result<Self::Batch>;
    /// One step's forward pass: `body` runs every op of the step over the uploaded batch and
    /// returns the logits. A backend may record the ops once per batch shape and replay the
    /// recording on later steps of that shape (CUDA graphs), as long as the logits are those
    /// `body` computes; the default uploads the batch and runs `body`.
    #[allow(clippy::type_complexity)] // the closure's types are the trait's own
    fn run_step(
        &self,
        batch: &BatchInput,
        kv: &mut Self::KvCache,
        body: &mut dyn FnMut(&Self::Batch, &mut Self::KvCache) -> Result<Self::Tensor>,
    ) -> Result<Self::Tensor> {
        let meta = self.upload_batch(batch)?;
        body(&meta, kv)
    }
    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<Self::KvCache>;
    /// Host blocks for swapping (`spec.num_blocks` of them).
    fn alloc_swap_space(&self, spec: &KvCacheSpec) -> Result<Self::SwapSpace>;
    /// Copies whole blocks `(from, to)` within the cache, every layer (copy-on-write).
    fn copy_blocks(&self, cache: &mut Self::KvCache, copies: &[BlockCopy]) -> Result<()>;
    /// Copies device blocks to host blocks `(device, host)`, every layer.
    fn swap_out(
        &self,
        cache: &Self::KvCache,
        swap: &mut Self::SwapSpace,
        copies: &[BlockCopy],
    ) -> Result<()>;
    /// Copies host blocks back to device blocks `(host, device)`, every layer.
    fn swap_in(
        &self,
        swap: &Self::SwapSpace,
        cache: &mut Self::KvCache,
        copies: &[BlockCopy],
    ) -> Result<()>;
    /// Bytes one cached K or V element takes (f32 on the CPU); sizes the KV pool.
    fn kv_element_bytes(&self) -> usize {
        4
    }
    /// Device memory, for sizing the KV pool; `None` where the backend cannot tell (CPU:
    /// the pool is sized from an explicit budget).
    fn device_memory(&self) -> Option<DeviceMemory> {
        None
    }
    /// Reads a tensor back; waits for all enqueued work that produces it.
    fn to_host(&self, tensor: &Self::Tensor) -> Result<HostTensor>;
    /// Each row's argmax (lowest index on ties) computed where the tensor lives, read back as
    /// one id per row; `None` where the backend has no such shortcut (the host then reads the
    /// rows).
    fn argmax_to_host(&self, _logits: &Self::Tensor) -> Result<Option<Vec<u32>>> {
        Ok(None)
    }
    /// Starts the step's one read-back: each row's argmax when `argmax` and the backend has
    /// `argmax_to_host`, else every row. The default reads synchronously; backends whose
    /// device runs asynchronously return the read in flight (see `PendingLogits`).
    fn read_logits(&self, logits: &Self::Tensor, argmax: bool) -> Result<PendingLogits> {
        if argmax {
            if let Some(ids) = self.argmax_to_host(logits)? {
                return Ok(PendingLogits::Ready(StepLogits {
                    rows: Vec::new(),
                    argmax: Some(ids),
                }));
            }
        }
        Ok(PendingLogits::Ready(StepLogits {
            rows: self.to_host(logits)?.data,
            argmax: None,
        }))
    }
    /// Blocks until the device has finished everything submitted and completed pending
    /// read-backs (native only; the default does nothing: ops already ran).
    fn wait_device(&self) -> Result<()> {
        Ok(())
    }

    /// `out[t] = table[token_ids[t]]`: `[num_tokens, hidden]`.
    fn embedding(&self, table: &Self::Tensor, batch: &Self::Batch) -> Result<Self::Tensor>;
    /// `x / rms(x) * weight` over each run of `weight.len()` values: whole rows when the
    /// weight is as wide as `x`, each head of a row when it is `head_dim` wide (per-head q/k
    /// norms). The row width must be a multiple of the weight's length.
    fn rms_norm(&self, x: &Self::Tensor, weight: &Self::Tensor, eps: f32) -> Result<Self::Tensor>;
    /// `x [m, k] · wᵀ` for a linear weight `w [n, k]`: `[m, n]`.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor>;
    /// `x · wᵢᵀ` for several weights that share the input (Q, K, V; gate, up): one call, so a
    /// backend can run them as one pass (one parallel region on the CPU, where waking the
    /// threads per matmul costs as much as a small decode matmul).
    fn matmul_many(&self, x: &Self::Tensor, ws: &[&Self::Tensor]) -> Result<Vec<Self::Tensor>> {
        ws.iter().map(|w| self.matmul(x, w)).collect()
    }
    /// The vocabulary projection `x · lm_headᵀ`: `matmul`, except where a backend trades
    /// activation precision for speed in `matmul` (the CPU's 8-bit activations) and keeps the
    /// logits, which sampling reads directly, precise.
    fn matmul_logits(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor> {
        self.matmul(x, w)
    }
    /// `x[r] += bias` for every row.
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Tensor) -> Result<()>;
    /// `x += y` (residual connection).
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// `x += y`, then `rms_norm(x, weight, eps)`: a residual connection and the norm the next
    /// block opens with, which a GPU backend does in one pass (one launch, `x` read once).
    fn add_rms_norm(
        &self,
        x: &mut Self::Tensor,
        y: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor> {
        self.add_assign(x, y)?;
        self.rms_norm(x, weight, eps)
    }
    /// `silu(gate) * up`.
    fn silu_mul(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;
    /// `gelu_tanh(gate) * up`, GELU's tanh approximation
    /// `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))` (Gemma).
    fn gelu_tanh_mul(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;
    /// gpt-oss's SwiGLU: `(clamp(up, -limit, limit) + 1) · g · σ(alpha · g)` with
    /// `g = min(gate, limit)`.
    fn swiglu_clamped(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        alpha: f32,
        limit: f32,
    ) -> Result<Self::Tensor>;
    /// `x *= s` (embedding, residual and logit multipliers).
    fn scale(&self, x: &mut Self::Tensor, s: f32) -> Result<()>;
    /// `x = cap · tanh(x / cap)` (final logit soft-capping).
    fn softcap(&self, x: &mut Self::Tensor, cap: f32) -> Result<()>;
    /// Rotates `x [num_tokens, n_heads * head_dim]` in place at the batch positions, with the
    /// `[max_len, rotary_dim]` cos/sin table of `Rope::cos_sin`: the first `rotary_dim`
    /// (≤ `head_dim`, even) dimensions of each head rotate, the rest pass through.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        batch: &Self::Batch,
        cos_sin: &Self::Tensor,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()>;
    /// Stores this step's K and V `[num_tokens, kv_heads * head_dim]` at the batch slot mapping.
    fn write_kv(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        k: &Self::Tensor,
        v: &Self::Tensor,
        batch: &Self::Batch,
    ) -> Result<()>;
    /// Causal attention of `q [num_tokens, heads * head_dim]` over each sequence's cached K/V,
    /// read through its block table: a query at position p sees keys 0..=p, or only the last
    /// `params.window` of them. Prefill chunks and decode tokens mix freely in one batch.
    /// `sinks [heads]` (gpt-oss): a per-head logit that joins each softmax's denominator and
    /// attends to nothing, so a query may give less than all its weight to the keys.
    fn paged_attention(
        &self,
        q: &Self::Tensor,
        cache: &Self::KvCache,
        layer: usize,
        batch: &Self::Batch,
        params: &AttentionParams,
        sinks: Option<&Self::Tensor>,
    ) -> Result<Self::Tensor>;
    /// Sums `x` element-wise over the ranks of the tensor-parallel group, in place (the
    /// row-parallel o_proj and down_proj outputs). Called only with more than one rank; a
    /// backend without collectives refuses (the default).
    fn all_reduce_sum(&self, _x: &mut Self::Tensor) -> Result<()> {
        Err(crate::error::InferError::Distributed(format!(
            "the {} backend has no collectives (tensor parallelism runs on the cpu backend over MPI and on cuda over NCCL)",
            self.name()
        )))
    }
    /// Routes every row of the router logits `[tokens, num_experts]` to its top-k experts,
    /// scored as `routing.scoring` says, and groups the assignments by expert (as
    /// `MoeRouting::route` does on the host; ties go to the lower expert).
    fn moe_route(&self, logits: &Self::Tensor, routing: &MoeRouting) -> Result<Self::Routing>;
    /// The routing in host memory (tests, checks).
    fn routing_to_host(&self, routing: &Self::Routing) -> Result<HostRouting>;
    /// The expert-grouped matmul: for each assignment `a = t·k + s`,
    /// `out[a] = x[row] · experts[ids[a]]ᵀ` with `experts [num_experts, n, cols]` (stored as
    /// `upload_packed` or `upload_matrix` left it) and `row` the token `t` when `x` has a row
    /// per token, or `a` when it has one per assignment. Each expert's weights are read once
    /// for all the tokens routed to it. Output `[tokens · k, n]`.
    fn moe_matmul(
        &self,
        x: &Self::Tensor,
        experts: &Self::Tensor,
        routing: &Self::Routing,
    ) -> Result<Self::Tensor>;
    /// `y[a] += bias[ids[a]]` for each assignment `a` of `y [tokens · k, n]`, with
    /// `bias [num_experts, n]` (gpt-oss's expert biases).
    fn moe_add_bias(
        &self,
        y: &mut Self::Tensor,
        bias: &Self::Tensor,
        routing: &Self::Routing,
    ) -> Result<()>;
    /// Each token's expert outputs summed with its routing weights:
    /// `out[t] = Σₛ weights[t·k + s] · y[t·k + s]`, `[tokens, cols]`.
    fn moe_combine(&self, y: &Self::Tensor, routing: &Self::Routing) -> Result<Self::Tensor>;
    /// Rows of `x` listed in the batch's `logits_indices`.
    fn gather_logit_rows(&self, x: &Self::Tensor, batch: &Self::Batch) -> Result<Self::Tensor>;
}
