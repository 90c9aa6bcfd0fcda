//! `impl Backend for CudaBackend`: shapes checked on the host, then one kernel launch (or a
//! cuBLAS call) per op on the device's stream.

use cudarc::driver::PushKernelArg;
use infer_core::backend::{AttentionParams, Backend, DeviceMemory, DeviceTensor, KvCacheSpec};
use infer_core::batch::BatchInput;
use infer_core::block_manager::BlockCopy;
use infer_core::config::RopeStyle;
use infer_core::error::{InferError, Result};
use infer_core::moe::{HostRouting, MoeRouting};
use infer_core::weights::{HostTensor, PackedTensor};
use infer_core::BackendError;

use crate::backend::{CudaBackend, CudaWeights};
use crate::batch::CudaBatch;
use crate::cache::{CudaKvCache, CudaSwapSpace};
use crate::device::{elementwise, launch_rows, threads_for};
use crate::error::u32_arg;
use crate::error::{cuda_err, CudaError};
use crate::quant::Matvec;
use crate::tensor::{CudaTensor, Storage};

type CudaResult<T> = std::result::Result<T, CudaError>;

/// Element-wise ops: `a` and `b` (named as in the op) hold as many elements.
fn same_len(
    op: &'static str,
    a: (&'static str, &CudaTensor),
    b: (&'static str, &CudaTensor),
) -> CudaResult<()> {
    if a.1.len() != b.1.len() {
        let operands = [(a.0, a.1.shape()), (b.0, b.1.shape())];
        return Err(BackendError::shape(op, &operands, "equal element counts").into());
    }
    Ok(())
}
impl CudaBackend {
    /// `act(gate) * up` with the element-wise kernel `kernel` (`silu_mul`, `gelu_tanh_mul`).
    fn gated_act(
        &self,
        kernel: &'static str,
        gate: &CudaTensor,
        up: &CudaTensor,
    ) -> Result<CudaTensor> {
        same_len(kernel, ("gate", gate), ("up", up))?;
        let len = gate.len();
        // Every element is written by the kernel below.
        let mut out = self.output_f32(len)?;
        let n = u32_arg(kernel, len)?;
        let mut b = self.dev.stream.launch_builder(self.dev.function(kernel)?);
        b.arg(gate.f32(kernel)?)
            .arg(up.f32(kernel)?)
            .arg(&mut out)
            .arg(&n);
        // SAFETY: silu_mul / gelu_tanh_mul(const float*, const float*, float*, u32) over n
        // elements of each.
        unsafe { b.launch(elementwise(len)) }.map_err(CudaError::from)?;
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: gate.shape.clone(),
        })
    }

    /// `x = f(x, value)` in place with the element-wise kernel `kernel` (`scale`, `softcap`).
    fn scale_in_place(&self, kernel: &'static str, x: &mut CudaTensor, value: f32) -> Result<()> {
        let len = x.len();
        let n = u32_arg(kernel, len)?;
        let mut b = self.dev.stream.launch_builder(self.dev.function(kernel)?);
        b.arg(x.f32_mut(kernel)?).arg(&value).arg(&n);
        // SAFETY: scale / softcap(float*, float, u32) over x's n elements.
        unsafe { b.launch(elementwise(len)) }.map_err(CudaError::from)?;
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Batch = CudaBatch;
    type KvCache = CudaKvCache;
    type SwapSpace = CudaSwapSpace;
    type Routing = crate::moe::CudaRouting;

    fn name(&self) -> String {
        let (major, minor) = self.dev.arch;
        let weights = match self.weights {
            CudaWeights::Packed => "packed",
            CudaWeights::F16 => "f16",
            CudaWeights::F32 => "f32",
        };
        format!(
            "cuda ({}, sm_{major}{minor}, {weights} weights)",
            self.dev.name
        )
    }

    fn upload(&self, t: &HostTensor) -> Result<CudaTensor> {
        let data = if t.data.is_empty() {
            self.dev
                .stream
                .alloc_zeros::<f32>(1)
                .map_err(CudaError::from)?
        } else {
            self.dev
                .stream
                .clone_htod(&t.data)
                .map_err(CudaError::from)?
        };
        Ok(CudaTensor {
            storage: Storage::F32(data),
            shape: t.shape.clone(),
        })
    }

    fn upload_packed(&self, t: &PackedTensor) -> Result<Option<CudaTensor>> {
        Ok(self.upload_packed_matrix(t)?)
    }

    fn upload_matrix(&self, t: &HostTensor) -> Result<CudaTensor> {
        if self.weights == CudaWeights::F32 || t.data.is_empty() {
            return self.upload(t);
        }
        let bits: Vec<u16> = t
            .data
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        let data = self.dev.stream.clone_htod(&bits).map_err(CudaError::from)?;
        Ok(CudaTensor {
            storage: Storage::F16(data),
            shape: t.shape.clone(),
        })
    }

    fn upload_batch(&self, b: &BatchInput) -> Result<CudaBatch> {
        let token_seq = b.token_seqs();
        let max_context = b
            .positions
            .iter()
            .map(|&p| p as usize + 1)
            .max()
            .unwrap_or(0);
        Ok(CudaBatch {
            token_ids: self.upload_u32(&b.token_ids)?,
            positions: self.upload_u32(&b.positions)?,
            slots: self.upload_u32(&b.slot_mapping)?,
            token_seq: self.upload_u32(&token_seq)?,
            block_tables: self.upload_u32(&b.block_tables)?,
            logits_indices: self.upload_u32(&b.logits_indices)?,
            input: b.clone(),
            max_context,
            attention_parts: max_context
                .div_ceil(crate::kernels::ATTENTION_PARTITION)
                .max(1),
            max_slot: b.slot_mapping.iter().copied().max(),
            max_block: b.block_tables.iter().copied().max(),
        })
    }

    fn run_step(
        &self,
        batch: &BatchInput,
        kv: &mut CudaKvCache,
        body: &mut crate::backend::graph::BodyFn<'_>,
    ) -> Result<CudaTensor> {
        self.run_step_graphed(batch, kv, body)
    }

    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<CudaKvCache> {
        self.new_kv_cache(spec)
    }

    fn alloc_swap_space(&self, spec: &KvCacheSpec) -> Result<CudaSwapSpace> {
        self.new_swap_space(spec)
    }

    fn copy_blocks(&self, cache: &mut CudaKvCache, copies: &[BlockCopy]) -> Result<()> {
        self.copy_kv_blocks(cache, copies)
    }

    fn swap_out(
        &self,
        cache: &CudaKvCache,
        swap: &mut CudaSwapSpace,
        copies: &[BlockCopy],
    ) -> Result<()> {
        self.swap_out_blocks(cache, swap, copies)
    }

    fn swap_in(
        &self,
        swap: &CudaSwapSpace,
        cache: &mut CudaKvCache,
        copies: &[BlockCopy],
    ) -> Result<()> {
        self.swap_in_blocks(swap, cache, copies)
    }

    fn kv_element_bytes(&self) -> usize {
        2
    }

    fn device_memory(&self) -> Option<DeviceMemory> {
        crate::device::trim_pool(&self.dev).ok()?;
        let (free, total) = self.dev.ctx.mem_get_info().ok()?;
        let peak_step = self
            .peak_step_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        Some(DeviceMemory {
            total_bytes: total as u64,
            // In use now (weights, other processes) plus what the largest step allocated.
            peak_used_bytes: (total - free) as u64 + peak_step,
        })
    }

    fn to_host(&self, t: &CudaTensor) -> Result<HostTensor> {
        let data = self
            .dev
            .stream
            .clone_dtoh(t.f32("to_host")?)
            .map_err(CudaError::from)?;
        self.step_done();
        let mut data = data;
        data.truncate(t.len());
        Ok(HostTensor::new(t.shape.clone(), data))
    }

    fn argmax_to_host(&self, logits: &CudaTensor) -> Result<Option<Vec<u32>>> {
        let (rows, cols) = logits.rows_cols();
        let mut ids = self
            .dev
            .stream
            .alloc_zeros::<u32>(rows.max(1))
            .map_err(CudaError::from)?;
        let cols32 = u32_arg("argmax", cols)?;
        let f = self.dev.function("argmax")?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(logits.f32("argmax")?).arg(&mut ids).arg(&cols32);
        // SAFETY: argmax(const float*, u32*, u32) with 1024 threads (its shared arrays' size),
        // one block per row of `cols`.
        unsafe { launch_rows(&mut b, rows, 1024) }?;
        let mut out = self.dev.stream.clone_dtoh(&ids).map_err(CudaError::from)?;
        self.step_done();
        out.truncate(rows);
        Ok(Some(out))
    }

    fn embedding(&self, table: &CudaTensor, batch: &CudaBatch) -> Result<CudaTensor> {
        let (vocab, hidden) = table.rows_cols();
        BackendError::check_indices("embedding", "token id", &batch.input.token_ids, vocab)
            .map_err(cuda_err)?;
        let n = batch.input.num_tokens();
        // Every element is written by the kernel below.
        let mut out = self.output_f32(n * hidden)?;
        let h = u32_arg("embedding", hidden)?;
        let s = &self.dev.stream;
        match &table.storage {
            Storage::F16(t) => {
                let mut b = s.launch_builder(self.dev.function("embedding_f16")?);
                b.arg(t).arg(&batch.token_ids).arg(&mut out).arg(&h);
                // SAFETY: ids were checked against the table's rows; out holds n * hidden.
                unsafe { launch_rows(&mut b, n, 256) }?;
            }
            Storage::F32(t) => {
                let mut b = s.launch_builder(self.dev.function("embedding_f32")?);
                b.arg(t).arg(&batch.token_ids).arg(&mut out).arg(&h);
                // SAFETY: as above.
                unsafe { launch_rows(&mut b, n, 256) }?;
            }
            Storage::Packed { .. } => {
                self.embedding_packed(table, &batch.token_ids, n, &mut out)?
            }
        }
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: vec![n, hidden],
        })
    }

    fn rms_norm(&self, x: &CudaTensor, weight: &CudaTensor, eps: f32) -> Result<CudaTensor> {
        Ok(self.norm_rows(x, weight, eps)?)
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        Ok(self.gemm(x, w)?)
    }

    /// Decode rows against several packed matrices (QKV, gate and up) quantize the
    /// activations once for all of them.
    fn matmul_many(&self, x: &CudaTensor, ws: &[&CudaTensor]) -> Result<Vec<CudaTensor>> {
        let (m, k) = x.rows_cols();
        let kernels: Option<Vec<&'static str>> = ws
            .iter()
            .map(|w| match self.matvec_kernel(w, m) {
                Some(Matvec::Q8(kernel)) if w.rows_cols().1 == k && m > 0 => Some(kernel),
                _ => None,
            })
            .collect();
        let Some(kernels) = kernels.filter(|k| k.len() > 1) else {
            return ws.iter().map(|w| self.matmul(x, w)).collect();
        };
        let xq = self.quantize_q8_1(x)?;
        kernels
            .into_iter()
            .zip(ws)
            .map(|(kernel, w)| {
                let mut shape = x.shape.clone();
                if let Some(last) = shape.last_mut() {
                    *last = w.rows_cols().0;
                }
                Ok(self.matvec_q8(kernel, &xq, w, shape)?)
            })
            .collect()
    }

    fn add_bias(&self, x: &mut CudaTensor, bias: &CudaTensor) -> Result<()> {
        let (_, cols) = x.rows_cols();
        if bias.len() != cols {
            return Err(cuda_err(BackendError::shape(
                "add_bias",
                &[("x", &x.shape), ("bias", &bias.shape)],
                "one bias per column of x",
            )));
        }
        let (n, c) = (u32_arg("add_bias", x.len())?, u32_arg("add_bias", cols)?);
        let len = x.len();
        let mut b = self
            .dev
            .stream
            .launch_builder(self.dev.function("add_bias")?);
        b.arg(x.f32_mut("add_bias")?)
            .arg(bias.f32("add_bias")?)
            .arg(&n)
            .arg(&c);
        // SAFETY: add_bias(float*, const float*, u32 n, u32 cols) with n = x's length.
        unsafe { b.launch(elementwise(len)) }.map_err(CudaError::from)?;
        Ok(())
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        same_len("add_assign", ("x", x), ("y", y))?;
        let len = x.len();
        let n = u32_arg("add_assign", len)?;
        let mut b = self
            .dev
            .stream
            .launch_builder(self.dev.function("add_assign")?);
        b.arg(x.f32_mut("add_assign")?)
            .arg(y.f32("add_assign")?)
            .arg(&n);
        // SAFETY: add_assign(float*, const float*, u32) over n elements of both.
        unsafe { b.launch(elementwise(len)) }.map_err(CudaError::from)?;
        Ok(())
    }

    fn add_rms_norm(
        &self,
        x: &mut CudaTensor,
        y: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        if weight.len() != x.rows_cols().1 {
            // Per-head norms: the two ops.
            self.add_assign(x, y)?;
            return self.rms_norm(x, weight, eps);
        }
        Ok(self.add_norm_rows(x, y, weight, eps)?)
    }

    fn silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        self.gated_act("silu_mul", gate, up)
    }

    fn gelu_tanh_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        self.gated_act("gelu_tanh_mul", gate, up)
    }

    fn swiglu_clamped(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        alpha: f32,
        limit: f32,
    ) -> Result<CudaTensor> {
        const K: &str = "swiglu_clamped";
        same_len(K, ("gate", gate), ("up", up))?;
        let len = gate.len();
        let mut out = self.output_f32(len)?;
        let n = u32_arg(K, len)?;
        let mut b = self.dev.stream.launch_builder(self.dev.function(K)?);
        b.arg(gate.f32(K)?)
            .arg(up.f32(K)?)
            .arg(&mut out)
            .arg(&alpha)
            .arg(&limit)
            .arg(&n);
        // SAFETY: swiglu_clamped(const float*, const float*, float*, float, float, u32) over n
        // elements of each.
        unsafe { b.launch(elementwise(len)) }.map_err(CudaError::from)?;
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: gate.shape.clone(),
        })
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) -> Result<()> {
        self.scale_in_place("scale", x, s)
    }

    fn softcap(&self, x: &mut CudaTensor, cap: f32) -> Result<()> {
        self.scale_in_place("softcap", x, cap)
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        batch: &CudaBatch,
        cos_sin: &CudaTensor,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let (rows, cols) = x.rows_cols();
        let max_pos = batch.max_context;
        let (table_rows, rotary_dim) = cos_sin.rows_cols();
        if rows != batch.input.num_tokens()
            || head_dim == 0
            || !cols.is_multiple_of(head_dim)
            || rotary_dim > head_dim
            || !rotary_dim.is_multiple_of(2)
        {
            return Err(cuda_err(BackendError::shape(
                "rope",
                &[("x", &x.shape), ("cos_sin", &cos_sin.shape)],
                format!(
                    "x [{} tokens, heads × {head_dim}], cos_sin [positions, an even rotary \
                     dim ≤ {head_dim}]",
                    batch.input.num_tokens()
                ),
            )));
        }
        // Positions run below the batch's longest context.
        if table_rows < max_pos {
            let e =
                BackendError::out_of_range("rope", "position", (max_pos - 1) as u64, table_rows);
            return Err(cuda_err(e));
        }
        let heads = u32_arg("rope", cols / head_dim)?;
        let hd = u32_arg("rope", head_dim)?;
        let rot = u32_arg("rope", rotary_dim)?;
        let style = match style {
            RopeStyle::AdjacentPairs => 0u32,
            RopeStyle::HalfSplit => 1u32,
        };
        let mut b = self.dev.stream.launch_builder(self.dev.function("rope")?);
        b.arg(x.f32_mut("rope")?)
            .arg(&batch.positions)
            .arg(cos_sin.f32("rope")?);
        b.arg(&heads).arg(&hd).arg(&rot).arg(&style);
        let pairs = cols / head_dim * (rotary_dim / 2);
        // SAFETY: rope(float*, const u32*, const float*, u32, u32, u32, u32): one block per
        // token (threads over its heads' rotated pairs), positions checked against the
        // table's rows, rotary_dim ≤ head_dim.
        unsafe { launch_rows(&mut b, rows, threads_for(pairs)) }?;
        Ok(())
    }

    fn write_kv(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        k: &CudaTensor,
        v: &CudaTensor,
        batch: &CudaBatch,
    ) -> Result<()> {
        self.write_kv_rows(cache, layer, k, v, batch)
    }

    fn paged_attention(
        &self,
        q: &CudaTensor,
        cache: &CudaKvCache,
        layer: usize,
        batch: &CudaBatch,
        p: &AttentionParams,
        sinks: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        crate::attention::paged_attention(self, q, cache, layer, batch, p, sinks)
    }

    fn all_reduce_sum(&self, x: &mut CudaTensor) -> Result<()> {
        let Some(comm) = &self.nccl else {
            return Err(InferError::Distributed(
                "this CUDA backend joined no NCCL communicator".into(),
            ));
        };
        Ok(comm.all_reduce_sum(x.f32_mut("all_reduce_sum")?)?)
    }

    fn moe_route(&self, logits: &CudaTensor, routing: &MoeRouting) -> Result<Self::Routing> {
        self.route(logits, routing)
    }

    fn routing_to_host(&self, routing: &Self::Routing) -> Result<HostRouting> {
        self.routing_host(routing)
    }

    fn moe_matmul(
        &self,
        x: &CudaTensor,
        experts: &CudaTensor,
        routing: &Self::Routing,
    ) -> Result<CudaTensor> {
        self.grouped_matmul(x, experts, routing)
    }

    fn moe_add_bias(
        &self,
        y: &mut CudaTensor,
        bias: &CudaTensor,
        routing: &Self::Routing,
    ) -> Result<()> {
        self.add_expert_bias(y, bias, routing)
    }

    fn moe_combine(&self, y: &CudaTensor, routing: &Self::Routing) -> Result<CudaTensor> {
        self.combine(y, routing)
    }

    fn gather_logit_rows(&self, x: &CudaTensor, batch: &CudaBatch) -> Result<CudaTensor> {
        let (rows, cols) = x.rows_cols();
        let idx = &batch.input.logits_indices;
        BackendError::check_indices("gather_logit_rows", "row", idx, rows).map_err(cuda_err)?;
        // Every element is written by the kernel below.
        let mut out = self.output_f32(idx.len() * cols)?;
        let c = u32_arg("gather_logit_rows", cols)?;
        let mut b = self
            .dev
            .stream
            .launch_builder(self.dev.function("gather_rows")?);
        b.arg(x.f32("gather_logit_rows")?)
            .arg(&batch.logits_indices)
            .arg(&mut out)
            .arg(&c);
        // SAFETY: gather_rows(const float*, const u32*, float*, u32); rows checked above.
        unsafe { launch_rows(&mut b, idx.len(), 256) }?;
        Ok(CudaTensor {
            storage: Storage::F32(out),
            shape: vec![idx.len(), cols],
        })
    }
}
