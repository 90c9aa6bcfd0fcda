//! The `Backend` trait on wgpu. Ops record into the step's command encoder (see
//! `recorder`); `to_host` and `argmax_to_host` submit and read back, so one engine step is one
//! submission and reads back only logits rows or one id per row.

use infer_core::backend::{
    AttentionParams, Backend, DeviceTensor, KvCacheSpec, PendingLogits, StepLogits,
};
use infer_core::batch::BatchInput;
use infer_core::block_manager::BlockCopy;
use infer_core::config::RopeStyle;
use infer_core::error::Result;
use infer_core::moe::{HostRouting, MoeRouting};
use infer_core::weights::HostTensor;
use infer_core::BackendError;

use crate::cache::{row_and_block, WgpuKvCache, WgpuSwapSpace};
use crate::context::{gpu_err, wgpu_err};
use crate::device::WgpuBackend;
use crate::kernels::{AttentionShape, GatedAct, WeightStorage};
use crate::pool::GpuBuffer;
use crate::tensor::WgpuTensor;

pub struct WgpuBatch {
    input: BatchInput,
    token_ids: GpuBuffer,
    positions: GpuBuffer,
    slots: GpuBuffer,
    block_tables: GpuBuffer,
    /// (position, sequence index) per token.
    token_info: GpuBuffer,
    logits_indices: GpuBuffer,
}

impl WgpuBackend {
    /// `act(gate) * up` (SiLU, or GELU-tanh).
    fn gated_act(&self, gate: &WgpuTensor, up: &WgpuTensor, act: GatedAct) -> Result<WgpuTensor> {
        let op = match act {
            GatedAct::Silu => "silu_mul",
            GatedAct::GeluTanh => "gelu_tanh_mul",
            GatedAct::SwigluClamped { .. } => "swiglu_clamped",
        };
        BackendError::check_same_shape(op, ("gate", gate.shape()), ("up", up.shape()))
            .map_err(wgpu_err)?;
        let out = self
            .ctx
            .gated_act(gate.buf(op)?, up.buf(op)?, gate.len(), act);
        self.out(out, gate.shape().to_vec())
    }
}

impl Backend for WgpuBackend {
    type Tensor = WgpuTensor;
    type Batch = WgpuBatch;
    type KvCache = WgpuKvCache;
    type SwapSpace = WgpuSwapSpace;
    type Routing = crate::moe::WgpuRouting;

    fn name(&self) -> String {
        format!(
            "wgpu ({}, {:?} weights)",
            self.ctx.adapter_name(),
            self.weights
        )
    }

    fn upload(&self, t: &HostTensor) -> Result<WgpuTensor> {
        self.check_binding("upload", t.data.len() as u64 * 4)?;
        WgpuTensor::upload(&self.ctx, t, WeightStorage::F32, self.max_binding)
    }

    fn upload_matrix(&self, t: &HostTensor) -> Result<WgpuTensor> {
        let cols = t.shape.last().copied().unwrap_or(1);
        let storage = if cols.is_multiple_of(4) {
            self.weights
        } else {
            WeightStorage::F32
        };
        WgpuTensor::upload(&self.ctx, t, storage, self.max_binding)
    }

    fn upload_batch(&self, b: &BatchInput) -> Result<WgpuBatch> {
        let info: Vec<u32> = b
            .positions
            .iter()
            .zip(b.token_seqs())
            .flat_map(|(&pos, seq)| [pos, seq])
            .collect();
        let c = &self.ctx;
        Ok(WgpuBatch {
            token_ids: c.stage_u32(&b.token_ids),
            positions: c.stage_u32(&b.positions),
            slots: c.stage_u32(&b.slot_mapping),
            block_tables: c.stage_u32(&b.block_tables),
            token_info: c.stage_u32(&info),
            logits_indices: c.stage_u32(&b.logits_indices),
            input: b.clone(),
        })
    }

    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<WgpuKvCache> {
        self.new_kv_cache(spec)
    }

    fn alloc_swap_space(&self, spec: &KvCacheSpec) -> Result<WgpuSwapSpace> {
        Ok(Self::new_swap_space(spec))
    }

    fn copy_blocks(&self, cache: &mut WgpuKvCache, copies: &[BlockCopy]) -> Result<()> {
        self.record_block_copies(cache, copies)
    }

    fn swap_out(
        &self,
        cache: &WgpuKvCache,
        swap: &mut WgpuSwapSpace,
        copies: &[BlockCopy],
    ) -> Result<()> {
        self.read_blocks_to_host(cache, swap, copies)
    }

    fn swap_in(
        &self,
        swap: &WgpuSwapSpace,
        cache: &mut WgpuKvCache,
        copies: &[BlockCopy],
    ) -> Result<()> {
        self.write_blocks_from_host(swap, cache, copies)
    }

    fn to_host(&self, t: &WgpuTensor) -> Result<HostTensor> {
        let data = self
            .ctx
            .read_f32(t.buf("to_host")?, t.len())
            .map_err(gpu_err)?;
        Ok(HostTensor::new(t.shape().to_vec(), data))
    }

    fn argmax_to_host(&self, logits: &WgpuTensor) -> Result<Option<Vec<u32>>> {
        let (rows, cols) = logits.rows_cols();
        let ids = self
            .ctx
            .argmax(logits.buf("argmax")?, rows, cols)
            .map_err(gpu_err)?;
        Ok(Some(self.ctx.read_u32(&ids, rows).map_err(gpu_err)?))
    }

    fn read_logits(&self, logits: &WgpuTensor, argmax: bool) -> Result<PendingLogits> {
        let (rows, cols) = logits.rows_cols();
        let src = logits.buf("read_logits")?;
        // One id per row computed on the device, or every row.
        let ids = if argmax {
            Some(self.ctx.argmax(src, rows, cols).map_err(gpu_err)?)
        } else {
            None
        };
        let (buffer, words) = match &ids {
            Some(ids) => (ids, rows),
            None => (src, logits.len()),
        };
        let read = self
            .ctx
            .read_bytes_async(&[(buffer, 0, words as u64 * 4)])
            .map_err(gpu_err)?;
        Ok(PendingLogits::InFlight(Box::pin(async move {
            let bytes = read.await.map_err(gpu_err)?;
            Ok(if argmax {
                StepLogits {
                    rows: Vec::new(),
                    argmax: Some(bytemuck::cast_slice(&bytes).to_vec()),
                }
            } else {
                StepLogits {
                    rows: bytemuck::cast_slice(&bytes).to_vec(),
                    argmax: None,
                }
            })
        })))
    }

    fn wait_device(&self) -> Result<()> {
        self.ctx.wait_idle().map_err(gpu_err)
    }

    fn embedding(&self, table: &WgpuTensor, batch: &WgpuBatch) -> Result<WgpuTensor> {
        let (vocab, hidden) = table.rows_cols();
        BackendError::check_indices("embedding", "token id", &batch.input.token_ids, vocab)
            .map_err(wgpu_err)?;
        let n = batch.input.num_tokens();
        let out = self.ctx.embedding(&table.matrix(), &batch.token_ids, n);
        self.out(out, vec![n, hidden])
    }

    fn rms_norm(&self, x: &WgpuTensor, weight: &WgpuTensor, eps: f32) -> Result<WgpuTensor> {
        let (rows, cols) = x.rows_cols();
        let n = weight.len();
        if n == 0 || !cols.is_multiple_of(n) {
            return Err(wgpu_err(BackendError::shape(
                "rms_norm",
                &[("x", x.shape()), ("weight", weight.shape())],
                "a row of x is a whole number of weight vectors",
            )));
        }
        // Each run of the weight's length is a row of the kernel (a head, for q/k norms).
        let out = self.ctx.rms_norm(
            x.buf("rms_norm")?,
            weight.buf("rms_norm")?,
            rows * cols / n,
            n,
            eps,
        );
        self.out(out, x.shape().to_vec())
    }

    fn matmul(&self, x: &WgpuTensor, w: &WgpuTensor) -> Result<WgpuTensor> {
        let (m, k) = x.rows_cols();
        let (n, wk) = w.rows_cols();
        if k != wk {
            return Err(wgpu_err(BackendError::shape(
                "matmul",
                &[("x", x.shape()), ("w", w.shape())],
                "x [m, k] · w [n, k]ᵀ",
            )));
        }
        let out = self.ctx.matmul(x.buf("matmul")?, &w.matrix(), m);
        self.out(out, vec![m, n])
    }

    fn add_bias(&self, x: &mut WgpuTensor, bias: &WgpuTensor) -> Result<()> {
        let (_, cols) = x.rows_cols();
        if bias.len() != cols {
            return Err(wgpu_err(BackendError::shape(
                "add_bias",
                &[("x", x.shape()), ("bias", bias.shape())],
                "one bias per column of x",
            )));
        }
        self.ctx
            .add_bias(x.buf("add_bias")?, bias.buf("add_bias")?, x.len(), cols)
            .map_err(gpu_err)
    }

    fn add_assign(&self, x: &mut WgpuTensor, y: &WgpuTensor) -> Result<()> {
        BackendError::check_same_shape("add_assign", ("x", x.shape()), ("y", y.shape()))
            .map_err(wgpu_err)?;
        self.ctx
            .add_assign(x.buf("add_assign")?, y.buf("add_assign")?, x.len())
            .map_err(gpu_err)
    }

    fn silu_mul(&self, gate: &WgpuTensor, up: &WgpuTensor) -> Result<WgpuTensor> {
        self.gated_act(gate, up, GatedAct::Silu)
    }

    fn gelu_tanh_mul(&self, gate: &WgpuTensor, up: &WgpuTensor) -> Result<WgpuTensor> {
        self.gated_act(gate, up, GatedAct::GeluTanh)
    }

    fn swiglu_clamped(
        &self,
        gate: &WgpuTensor,
        up: &WgpuTensor,
        alpha: f32,
        limit: f32,
    ) -> Result<WgpuTensor> {
        self.gated_act(gate, up, GatedAct::SwigluClamped { alpha, limit })
    }

    fn scale(&self, x: &mut WgpuTensor, s: f32) -> Result<()> {
        self.ctx
            .scale(x.buf("scale")?, x.len(), s, false)
            .map_err(gpu_err)
    }

    fn softcap(&self, x: &mut WgpuTensor, cap: f32) -> Result<()> {
        self.ctx
            .scale(x.buf("softcap")?, x.len(), cap, true)
            .map_err(gpu_err)
    }

    fn rope(
        &self,
        x: &mut WgpuTensor,
        batch: &WgpuBatch,
        cos_sin: &WgpuTensor,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let (rows, cols) = x.rows_cols();
        let (max_pos, rotary_dim) = cos_sin.rows_cols();
        let n = batch.input.num_tokens();
        if rows != n
            || head_dim == 0
            || !cols.is_multiple_of(head_dim)
            || rotary_dim > head_dim
            || !rotary_dim.is_multiple_of(2)
        {
            return Err(wgpu_err(BackendError::shape(
                "rope",
                &[("x", x.shape()), ("cos_sin", cos_sin.shape())],
                format!(
                    "x [{n} tokens, heads × {head_dim}], cos_sin [positions, an even rotary dim ≤ {head_dim}]"
                ),
            )));
        }
        BackendError::check_indices("rope", "position", &batch.input.positions, max_pos)
            .map_err(wgpu_err)?;
        let adjacent = style == RopeStyle::AdjacentPairs;
        self.ctx
            .rope(
                x.buf("rope")?,
                &batch.positions,
                cos_sin.buf("rope")?,
                n,
                cols / head_dim,
                head_dim,
                rotary_dim,
                adjacent,
            )
            .map_err(gpu_err)
    }

    fn write_kv(
        &self,
        cache: &mut WgpuKvCache,
        layer: usize,
        k: &WgpuTensor,
        v: &WgpuTensor,
        batch: &WgpuBatch,
    ) -> Result<()> {
        let (row, _) = row_and_block(&cache.spec);
        let n = batch.input.num_tokens();
        let Some((kc, vc)) = cache.layers.get(layer) else {
            let layers = cache.spec.num_layers;
            return Err(wgpu_err(BackendError::out_of_range(
                "write_kv",
                "layer",
                layer as u64,
                layers,
            )));
        };
        if k.rows_cols() != (n, row) || v.rows_cols() != (n, row) {
            return Err(wgpu_err(BackendError::shape(
                "write_kv",
                &[("k", k.shape()), ("v", v.shape())],
                format!("k and v [{n} tokens, {row}]"),
            )));
        }
        let slots = cache.spec.num_blocks * cache.spec.block_size;
        BackendError::check_indices("write_kv", "slot", &batch.input.slot_mapping, slots)
            .map_err(wgpu_err)?;
        self.ctx
            .write_kv(
                k.buf("write_kv")?,
                v.buf("write_kv")?,
                &batch.slots,
                kc,
                vc,
                n,
                row,
            )
            .map_err(gpu_err)
    }

    fn paged_attention(
        &self,
        q: &WgpuTensor,
        cache: &WgpuKvCache,
        layer: usize,
        batch: &WgpuBatch,
        p: &AttentionParams,
        sinks: Option<&WgpuTensor>,
    ) -> Result<WgpuTensor> {
        if let Some(s) = sinks.filter(|s| s.len() != p.num_heads) {
            let e = BackendError::count("paged_attention", "sinks", s.len(), p.num_heads);
            return Err(wgpu_err(e));
        }
        let sinks = sinks.map(|s| s.buf("paged_attention")).transpose()?;
        let n = batch.input.num_tokens();
        let Some((kc, vc)) = cache.layers.get(layer) else {
            let layers = cache.spec.num_layers;
            let e = BackendError::out_of_range("paged_attention", "layer", layer as u64, layers);
            return Err(wgpu_err(e));
        };
        if q.rows_cols() != (n, p.num_heads * p.head_dim)
            || p.num_kv_heads != cache.spec.num_kv_heads
        {
            return Err(wgpu_err(BackendError::shape(
                "paged_attention",
                &[("q", q.shape())],
                format!(
                    "q [{n} tokens, {} heads × {}] with {p:?} over {:?}",
                    p.num_heads, p.head_dim, cache.spec
                ),
            )));
        }
        let blocks = &batch.input.block_tables;
        BackendError::check_indices("paged_attention", "block", blocks, cache.spec.num_blocks)
            .map_err(wgpu_err)?;
        let shape = AttentionShape {
            num_tokens: n,
            heads: p.num_heads,
            kv_heads: p.num_kv_heads,
            head_dim: p.head_dim,
            block_size: cache.spec.block_size,
            max_blocks: batch.input.max_blocks_per_seq,
            max_context: batch.input.context_lens.iter().copied().max().unwrap_or(0) as usize,
            scale: p.scale,
            window: p.window,
            softcap: p.softcap,
        };
        let out = self.ctx.paged_attention(
            q.buf("paged_attention")?,
            kc,
            vc,
            &batch.block_tables,
            &batch.token_info,
            sinks,
            shape,
        );
        self.out(out, vec![n, p.num_heads * p.head_dim])
    }

    fn moe_route(&self, logits: &WgpuTensor, routing: &MoeRouting) -> Result<Self::Routing> {
        self.route(logits, routing)
    }

    fn routing_to_host(&self, routing: &Self::Routing) -> Result<HostRouting> {
        self.routing_host(routing)
    }

    fn moe_matmul(
        &self,
        x: &WgpuTensor,
        experts: &WgpuTensor,
        routing: &Self::Routing,
    ) -> Result<WgpuTensor> {
        self.grouped_matmul(x, experts, routing)
    }

    fn moe_add_bias(
        &self,
        y: &mut WgpuTensor,
        bias: &WgpuTensor,
        routing: &Self::Routing,
    ) -> Result<()> {
        self.add_expert_bias(y, bias, routing)
    }

    fn moe_combine(&self, y: &WgpuTensor, routing: &Self::Routing) -> Result<WgpuTensor> {
        self.combine(y, routing)
    }

    fn gather_logit_rows(&self, x: &WgpuTensor, batch: &WgpuBatch) -> Result<WgpuTensor> {
        let (rows, cols) = x.rows_cols();
        let idx = &batch.input.logits_indices;
        BackendError::check_indices("gather_logit_rows", "row", idx, rows).map_err(wgpu_err)?;
        let out = self.ctx.gather_rows(
            x.buf("gather_logit_rows")?,
            &batch.logits_indices,
            idx.len(),
            cols,
        );
        self.out(out, vec![idx.len(), cols])
    }
}
