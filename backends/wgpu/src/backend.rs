//! The `Backend` trait on wgpu: f32 tensors in storage buffers, the paged KV cache as one K and
//! one V buffer per layer (rows `[slot, kv_heads * head_dim]`), swap space in host memory.
//! Ops enqueue work; only `to_host` waits.

use std::sync::Arc;

use infer_core::backend::{AttentionParams, Backend, DeviceTensor, KvCacheSpec};
use infer_core::batch::BatchInput;
use infer_core::block_manager::BlockCopy;
use infer_core::config::RopeStyle;
use infer_core::error::{InferError, Result};
use infer_core::weights::HostTensor;

use crate::context::{GpuContext, GpuError};
use crate::kernels::AttentionShape;

#[derive(Clone)]
pub struct WgpuBackend {
    ctx: Arc<GpuContext>,
}

#[derive(Clone)]
pub struct WgpuTensor {
    buffer: Arc<wgpu::Buffer>,
    shape: Vec<usize>,
}

impl DeviceTensor for WgpuTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
}

impl WgpuTensor {
    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    fn rows_cols(&self) -> (usize, usize) {
        let cols = self.shape.last().copied().unwrap_or(1);
        (self.len() / cols.max(1), cols)
    }
}

pub struct WgpuBatch {
    input: BatchInput,
    token_ids: wgpu::Buffer,
    positions: wgpu::Buffer,
    slots: wgpu::Buffer,
    block_tables: wgpu::Buffer,
    /// (position, sequence index) per token.
    token_info: wgpu::Buffer,
    logits_indices: wgpu::Buffer,
}

pub struct WgpuKvCache {
    spec: KvCacheSpec,
    /// Per layer: K and V.
    layers: Vec<(wgpu::Buffer, wgpu::Buffer)>,
}

/// Host copies of swapped-out blocks, laid out like the device cache.
pub struct WgpuSwapSpace {
    spec: KvCacheSpec,
    layers: Vec<(Vec<f32>, Vec<f32>)>,
}

fn err(e: GpuError) -> InferError {
    InferError::Backend {
        backend: "wgpu",
        message: e.to_string(),
    }
}

fn shape_err(op: &str, detail: String) -> InferError {
    InferError::Backend {
        backend: "wgpu",
        message: format!("{op}: {detail}"),
    }
}

impl WgpuBackend {
    /// Opens the adapter chosen by `WGPU_BACKEND` / `WGPU_ADAPTER_NAME` (see `GpuContext`).
    pub fn new() -> Result<Self> {
        Ok(WgpuBackend {
            ctx: Arc::new(GpuContext::new().map_err(err)?),
        })
    }

    pub fn with_context(ctx: Arc<GpuContext>) -> Self {
        WgpuBackend { ctx }
    }

    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    fn tensor(&self, buffer: wgpu::Buffer, shape: Vec<usize>) -> WgpuTensor {
        WgpuTensor {
            buffer: Arc::new(buffer),
            shape,
        }
    }

    /// Floats per cache row and per block.
    fn row_and_block(spec: &KvCacheSpec) -> (usize, usize) {
        let row = spec.num_kv_heads * spec.head_dim;
        (row, row * spec.block_size)
    }

    fn check_binding(&self, what: &str, floats: usize) -> Result<()> {
        let bytes = floats as u64 * 4;
        let limit = self.ctx.limits.max_storage_buffer_binding_size;
        if bytes > limit {
            return Err(shape_err(
                what,
                format!("{bytes} bytes exceed the adapter's {limit}-byte storage binding"),
            ));
        }
        Ok(())
    }
}

impl Backend for WgpuBackend {
    type Tensor = WgpuTensor;
    type Batch = WgpuBatch;
    type KvCache = WgpuKvCache;
    type SwapSpace = WgpuSwapSpace;

    fn name(&self) -> String {
        format!("wgpu ({})", self.ctx.adapter_name())
    }

    fn upload(&self, t: &HostTensor) -> Result<WgpuTensor> {
        self.check_binding("upload", t.data.len())?;
        Ok(self.tensor(self.ctx.upload_f32(&t.data), t.shape.clone()))
    }

    fn upload_batch(&self, b: &BatchInput) -> Result<WgpuBatch> {
        let mut info = Vec::with_capacity(2 * b.num_tokens());
        for t in 0..b.num_tokens() {
            let seq = b.query_start.partition_point(|&s| s as usize <= t) - 1;
            info.extend([b.positions[t], seq as u32]);
        }
        let c = &self.ctx;
        Ok(WgpuBatch {
            token_ids: c.upload_u32(&b.token_ids),
            positions: c.upload_u32(&b.positions),
            slots: c.upload_u32(&b.slot_mapping),
            block_tables: c.upload_u32(&b.block_tables),
            token_info: c.upload_u32(&info),
            logits_indices: c.upload_u32(&b.logits_indices),
            input: b.clone(),
        })
    }

    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<WgpuKvCache> {
        let (_, block) = Self::row_and_block(spec);
        let floats = spec.num_blocks * block;
        self.check_binding("KV cache layer", floats)?;
        let zeros = vec![0f32; floats.max(1)];
        let layers = (0..spec.num_layers)
            .map(|_| (self.ctx.upload_f32(&zeros), self.ctx.upload_f32(&zeros)))
            .collect();
        Ok(WgpuKvCache {
            spec: *spec,
            layers,
        })
    }

    fn alloc_swap_space(&self, spec: &KvCacheSpec) -> Result<WgpuSwapSpace> {
        let (_, block) = Self::row_and_block(spec);
        let floats = spec.num_blocks * block;
        let layers = (0..spec.num_layers)
            .map(|_| (vec![0f32; floats], vec![0f32; floats]))
            .collect();
        Ok(WgpuSwapSpace {
            spec: *spec,
            layers,
        })
    }

    fn copy_blocks(&self, cache: &mut WgpuKvCache, copies: &[BlockCopy]) -> Result<()> {
        let (_, block) = Self::row_and_block(&cache.spec);
        let bytes = block as u64 * 4;
        let mut encoder = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("copy_blocks"),
            });
        for (k, v) in &cache.layers {
            for &(from, to) in copies {
                for buf in [k, v] {
                    encoder.copy_buffer_to_buffer(
                        buf,
                        from as u64 * bytes,
                        buf,
                        to as u64 * bytes,
                        bytes,
                    );
                }
            }
        }
        self.ctx.queue.submit([encoder.finish()]);
        Ok(())
    }

    fn swap_out(
        &self,
        cache: &WgpuKvCache,
        swap: &mut WgpuSwapSpace,
        copies: &[BlockCopy],
    ) -> Result<()> {
        let (_, block) = Self::row_and_block(&cache.spec);
        let total = cache.spec.num_blocks * block;
        for ((k, v), (hk, hv)) in cache.layers.iter().zip(swap.layers.iter_mut()) {
            // Whole-layer read-back: simple, and swapping is the rare path.
            let dk = self.ctx.read_f32(k, total).map_err(err)?;
            let dv = self.ctx.read_f32(v, total).map_err(err)?;
            for &(dev, host) in copies {
                let (d, h) = (dev as usize * block, host as usize * block);
                hk[h..h + block].copy_from_slice(&dk[d..d + block]);
                hv[h..h + block].copy_from_slice(&dv[d..d + block]);
            }
        }
        Ok(())
    }

    fn swap_in(
        &self,
        swap: &WgpuSwapSpace,
        cache: &mut WgpuKvCache,
        copies: &[BlockCopy],
    ) -> Result<()> {
        let (_, block) = Self::row_and_block(&swap.spec);
        for ((hk, hv), (k, v)) in swap.layers.iter().zip(&cache.layers) {
            for &(host, dev) in copies {
                let (h, d) = (host as usize * block, dev as usize * block);
                let offset = d as u64 * 4;
                self.ctx
                    .queue
                    .write_buffer(k, offset, bytemuck::cast_slice(&hk[h..h + block]));
                self.ctx
                    .queue
                    .write_buffer(v, offset, bytemuck::cast_slice(&hv[h..h + block]));
            }
        }
        Ok(())
    }

    fn to_host(&self, t: &WgpuTensor) -> Result<HostTensor> {
        let data = self.ctx.read_f32(&t.buffer, t.len()).map_err(err)?;
        Ok(HostTensor::new(t.shape.clone(), data))
    }

    fn embedding(&self, table: &WgpuTensor, batch: &WgpuBatch) -> Result<WgpuTensor> {
        let (vocab, hidden) = table.rows_cols();
        if let Some(t) = batch.input.token_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(shape_err(
                "embedding",
                format!("token {t} >= vocab {vocab}"),
            ));
        }
        let n = batch.input.num_tokens();
        let out = self
            .ctx
            .embedding(&table.buffer, hidden, &batch.token_ids, n);
        Ok(self.tensor(out, vec![n, hidden]))
    }

    fn rms_norm(&self, x: &WgpuTensor, weight: &WgpuTensor, eps: f32) -> Result<WgpuTensor> {
        let (rows, cols) = x.rows_cols();
        if weight.len() != cols {
            return Err(shape_err(
                "rms_norm",
                format!("x {:?}, weight {:?}", x.shape, weight.shape),
            ));
        }
        let out = self
            .ctx
            .rms_norm(&x.buffer, &weight.buffer, rows, cols, eps);
        Ok(self.tensor(out, x.shape.clone()))
    }

    fn matmul(&self, x: &WgpuTensor, w: &WgpuTensor) -> Result<WgpuTensor> {
        let (m, k) = x.rows_cols();
        let (n, wk) = w.rows_cols();
        if k != wk {
            return Err(shape_err(
                "matmul",
                format!("x {:?} · w {:?}ᵀ", x.shape, w.shape),
            ));
        }
        let out = self.ctx.matmul(&x.buffer, &w.buffer, m, n, k);
        Ok(self.tensor(out, vec![m, n]))
    }

    fn add_bias(&self, x: &mut WgpuTensor, bias: &WgpuTensor) -> Result<()> {
        let (_, cols) = x.rows_cols();
        if bias.len() != cols {
            return Err(shape_err(
                "add_bias",
                format!("x {:?}, bias {:?}", x.shape, bias.shape),
            ));
        }
        self.ctx.add_bias(&x.buffer, &bias.buffer, x.len(), cols);
        Ok(())
    }

    fn add_assign(&self, x: &mut WgpuTensor, y: &WgpuTensor) -> Result<()> {
        if x.shape != y.shape {
            return Err(shape_err(
                "add_assign",
                format!("{:?} += {:?}", x.shape, y.shape),
            ));
        }
        self.ctx.add_assign(&x.buffer, &y.buffer, x.len());
        Ok(())
    }

    fn silu_mul(&self, gate: &WgpuTensor, up: &WgpuTensor) -> Result<WgpuTensor> {
        if gate.shape != up.shape {
            return Err(shape_err(
                "silu_mul",
                format!("{:?} vs {:?}", gate.shape, up.shape),
            ));
        }
        let out = self.ctx.silu_mul(&gate.buffer, &up.buffer, gate.len());
        Ok(self.tensor(out, gate.shape.clone()))
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
        let max_pos = cos_sin.rows_cols().0;
        let n = batch.input.num_tokens();
        if rows != n
            || head_dim == 0
            || !cols.is_multiple_of(head_dim)
            || cos_sin.rows_cols().1 != head_dim
        {
            return Err(shape_err(
                "rope",
                format!("x {:?} head_dim {head_dim} for {n} tokens", x.shape),
            ));
        }
        if let Some(p) = batch
            .input
            .positions
            .iter()
            .find(|&&p| p as usize >= max_pos)
        {
            return Err(shape_err(
                "rope",
                format!("position {p} beyond the table of {max_pos}"),
            ));
        }
        let adjacent = style == RopeStyle::AdjacentPairs;
        self.ctx.rope(
            &x.buffer,
            &batch.positions,
            &cos_sin.buffer,
            n,
            cols / head_dim,
            head_dim,
            adjacent,
        );
        Ok(())
    }

    fn write_kv(
        &self,
        cache: &mut WgpuKvCache,
        layer: usize,
        k: &WgpuTensor,
        v: &WgpuTensor,
        batch: &WgpuBatch,
    ) -> Result<()> {
        let (row, _) = Self::row_and_block(&cache.spec);
        let n = batch.input.num_tokens();
        let Some((kc, vc)) = cache.layers.get(layer) else {
            return Err(shape_err(
                "write_kv",
                format!("layer {layer} of {}", cache.spec.num_layers),
            ));
        };
        if k.rows_cols() != (n, row) || v.rows_cols() != (n, row) {
            return Err(shape_err(
                "write_kv",
                format!("k {:?}, v {:?} for rows of {row}", k.shape, v.shape),
            ));
        }
        let slots = cache.spec.num_blocks * cache.spec.block_size;
        if let Some(s) = batch
            .input
            .slot_mapping
            .iter()
            .find(|&&s| s as usize >= slots)
        {
            return Err(shape_err("write_kv", format!("slot {s} of {slots}")));
        }
        self.ctx
            .write_kv(&k.buffer, &v.buffer, &batch.slots, kc, vc, n, row);
        Ok(())
    }

    fn paged_attention(
        &self,
        q: &WgpuTensor,
        cache: &WgpuKvCache,
        layer: usize,
        batch: &WgpuBatch,
        p: &AttentionParams,
    ) -> Result<WgpuTensor> {
        let n = batch.input.num_tokens();
        let Some((kc, vc)) = cache.layers.get(layer) else {
            return Err(shape_err("paged_attention", format!("layer {layer}")));
        };
        if q.rows_cols() != (n, p.num_heads * p.head_dim)
            || p.num_kv_heads != cache.spec.num_kv_heads
        {
            return Err(shape_err(
                "paged_attention",
                format!("q {:?} for {n} tokens", q.shape),
            ));
        }
        let shape = AttentionShape {
            num_tokens: n,
            heads: p.num_heads,
            kv_heads: p.num_kv_heads,
            head_dim: p.head_dim,
            block_size: cache.spec.block_size,
            max_blocks: batch.input.max_blocks_per_seq,
            max_context: batch.input.context_lens.iter().copied().max().unwrap_or(0) as usize,
            scale: p.scale,
        };
        let out = self
            .ctx
            .paged_attention(
                &q.buffer,
                kc,
                vc,
                &batch.block_tables,
                &batch.token_info,
                shape,
            )
            .map_err(err)?;
        Ok(self.tensor(out, vec![n, p.num_heads * p.head_dim]))
    }

    fn gather_logit_rows(&self, x: &WgpuTensor, batch: &WgpuBatch) -> Result<WgpuTensor> {
        let (rows, cols) = x.rows_cols();
        let idx = &batch.input.logits_indices;
        if let Some(r) = idx.iter().find(|&&r| r as usize >= rows) {
            return Err(shape_err("gather_logit_rows", format!("row {r} of {rows}")));
        }
        let out = self
            .ctx
            .gather_rows(&x.buffer, &batch.logits_indices, idx.len(), cols);
        Ok(self.tensor(out, vec![idx.len(), cols]))
    }
}
