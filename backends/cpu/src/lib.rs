//! The CPU backend: pure Rust, f32 math, multithreaded with rayon (GEMMs through the `gemm`
//! crate). It is the reference every other backend is tested against, and the fallback without
//! a GPU. By default quantized matrices (every GGUF quant type) stay packed as stored. Q4_0,
//! Q4_1 and Q8_0 have f32 kernels that decode blocks inside the matmul (`quant`); the other
//! types decode on the integer path on 8-bit activations and prefill on f32 tiles (`qdot`).
//! Batched decode (2 to 64 rows) takes register-blocked f32 kernels that decode the common
//! block types in registers (`blocked`: AVX-512, AVX2, NEON). Every vector kernel has a level
//! (`Isa`: detected, or forced by `INFER_CPU_ISA`) and is tested against the scalar one.
//! On x86 with AVX2, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K matrices are repacked at load
//! into interleaved groups of 8 rows for the integer path (`qdot::interleave`;
//! `without_repacking` keeps them as stored, on the kernels above).
//! `CpuBackend::f32_weights()` dequantizes everything at load instead: the plain reference.

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]

mod attention;
mod awake;
pub mod bench;
mod blocked;
mod isa;
mod kv_cache;
mod matmul;
mod moe;
mod ops;
mod qdot;
mod quant;
mod random;
mod scale_table;
mod tensor;
mod tiles;

use std::sync::Arc;

use infer_core::block_manager::BlockCopy;
use infer_core::gguf::GgmlType;
use infer_core::moe::{HostRouting, MoeRouting};
use infer_core::{
    AttentionParams, Backend, BackendError, BatchInput, HostTensor, InferError, KvCacheSpec,
    PackedTensor, ProcessGroup, Result, RopeStyle,
};

pub use isa::{Isa, ISA_ENV};
use kv_cache::copy_between;
pub use kv_cache::CpuKvCache;
pub use matmul::matmul;
use qdot::Layout;
pub use qdot::{matmul_quantized, Activations};
use tensor::Storage;
pub use tensor::{CpuBatch, CpuTensor};

#[derive(Clone)]
pub struct CpuBackend {
    packed_weights: bool,
    /// Whether Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K matrices are repacked at load into
    /// interleaved rows (`qdot::interleave`) where this CPU has their kernels, instead of
    /// computed on in the file's layout.
    repack: bool,
    /// The tensor-parallel group whose MPI all-reduce sums the row-parallel outputs.
    group: Option<Arc<dyn ProcessGroup>>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("packed_weights", &self.packed_weights)
            .field("repack", &self.repack)
            .field("ranks", &self.group.as_ref().map(|g| g.size()))
            .finish()
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// Keeps quantized matrices packed (the fast default).
    pub fn new() -> Self {
        CpuBackend {
            packed_weights: true,
            repack: true,
            group: None,
        }
    }

    /// Keeps every packed matrix as stored, a view of the mapped file (no repacked copy:
    /// resident memory stays at the file's size), at the speed of the row-major kernels.
    pub fn without_repacking(self) -> Self {
        CpuBackend {
            repack: false,
            ..self
        }
    }

    /// Dequantizes every weight to f32 at load: the plain reference path.
    pub fn f32_weights() -> Self {
        CpuBackend {
            packed_weights: false,
            repack: false,
            group: None,
        }
    }

    /// Sums tensor-parallel partial results over `group` (its `all_reduce_sum`: MPI).
    pub fn with_group(self, group: Arc<dyn ProcessGroup>) -> Self {
        CpuBackend {
            group: Some(group),
            ..self
        }
    }
}

/// How finely the integer path quantizes the hidden states' matmuls. Two 8-bit planes: with one
/// (llama.cpp's choice) SmolLM2 loses its answers (see the README), and the tiny K-quant model's
/// logits moved 0.1 from the float64 reference, where two planes keep within 1.5e-3 (in groups
/// of 256; 4e-4 in groups of 16). On the interleaved K-quant kernels the second plane costs
/// the 1B Q4_K_M model 8 % of its decode (34.7-37.2 against 39.0-39.5 tok/s with one plane;
/// it cost a quarter on the row-major ones) and 30 % of its prefill time (1.33-1.44 against
/// 0.96-1.09 s for 128 tokens).
const HIDDEN_ACTIVATIONS: Activations = Activations::Int16;

/// The weight type and layout of `w` when matmuls with it read activations quantized by
/// `qdot` (types without f32 kernels).
fn reads_quantized(w: &CpuTensor) -> Option<(GgmlType, Layout)> {
    match &w.storage {
        Storage::Packed { dtype, layout, .. }
            if *layout == Layout::Interleaved || !quant::has_f32_kernels(*dtype) =>
        {
            Some((*dtype, *layout))
        }
        _ => None,
    }
}

/// `x · wᵀ`; the integer path (types without f32 kernels) quantizes `x` to `activations`, or
/// reads `prepared`, the same quantization done once for several matmuls.
fn matmul_with(
    x: &CpuTensor,
    w: &CpuTensor,
    activations: Activations,
    prepared: Option<&qdot::Prepared>,
) -> Result<CpuTensor> {
    let (m, k) = x.rows_cols();
    let (n, wk) = w.rows_cols();
    if k != wk {
        return Err(BackendError::shape(
            "matmul",
            &[("x", &x.shape), ("w", &w.shape)],
            "x [m, k] · w [n, k]ᵀ",
        )
        .on("cpu"));
    }
    let x = x.f32("matmul")?;
    let out = match &w.storage {
        Storage::F32(w) => matmul::matmul(x, w, m, k, n),
        Storage::Packed {
            dtype,
            data,
            layout: Layout::Rows,
        } if quant::has_f32_kernels(*dtype) => quant::matmul_packed(x, data, *dtype, m, k, n),
        Storage::Packed {
            dtype,
            data,
            layout,
        } => {
            let made;
            let prepared = match prepared {
                Some(p) => p,
                None => {
                    made = qdot::Prepared::new(activations, x, m, k, &[(*dtype, *layout)]);
                    &made
                }
            };
            qdot::matmul_prepared(prepared, data, *layout, *dtype, n)
        }
    };
    Ok(CpuTensor::new(vec![m, n], out))
}

fn check_layer(op: &'static str, cache: &CpuKvCache, layer: usize) -> Result<()> {
    if layer >= cache.spec.num_layers {
        let layers = cache.spec.num_layers;
        return Err(BackendError::out_of_range(op, "layer", layer as u64, layers).on("cpu"));
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Batch = CpuBatch;
    type KvCache = CpuKvCache;
    type SwapSpace = CpuKvCache;
    type Routing = HostRouting;

    fn name(&self) -> String {
        let weights = match (self.packed_weights, self.repack) {
            (true, true) => "packed, interleaved where it has kernels",
            (true, false) => "packed as stored",
            (false, _) => "f32",
        };
        format!(
            "cpu ({} threads, {weights} weights)",
            rayon::current_num_threads()
        )
    }

    fn upload(&self, t: &HostTensor) -> Result<CpuTensor> {
        Ok(CpuTensor::new(t.shape.clone(), t.data.clone()))
    }

    fn upload_packed(&self, t: &PackedTensor) -> Result<Option<CpuTensor>> {
        let (per_block, _) = t.dtype.block();
        // Matrices, and stacks of them (experts `[experts, rows, cols]`).
        let cols = t.shape.last().copied().unwrap_or(0);
        let rows = t.shape.iter().product::<usize>() / cols.max(1);
        let usable = self.packed_weights
            && t.dtype.is_quantized()
            && (t.shape.len() == 2 || t.shape.len() == 3)
            && cols.is_multiple_of(per_block)
            && t.data.len() == rows * t.row_bytes();
        if !usable {
            return Ok(None);
        }
        let (data, layout) =
            if self.repack && t.shape.len() == 2 && qdot::interleavable(t.dtype, rows, cols) {
                let data = qdot::interleave(t.dtype, &t.data, rows, cols);
                // Nothing reads the file's copy again: resident memory stays about the
                // model's size.
                t.data.release_pages();
                (data.into(), Layout::Interleaved)
            } else {
                (t.data.clone(), Layout::Rows)
            };
        Ok(Some(CpuTensor {
            shape: t.shape.clone(),
            storage: Storage::Packed {
                dtype: t.dtype,
                data,
                layout,
            },
        }))
    }

    /// The step with the pool's workers kept awake between its parallel regions
    /// (`awake::KeepAwake`).
    fn run_step(
        &self,
        batch: &BatchInput,
        kv: &mut CpuKvCache,
        body: &mut dyn FnMut(&CpuBatch, &mut CpuKvCache) -> Result<CpuTensor>,
    ) -> Result<CpuTensor> {
        let meta = self.upload_batch(batch)?;
        let _awake = awake::KeepAwake::new();
        body(&meta, kv)
    }

    fn upload_batch(&self, batch: &BatchInput) -> Result<CpuBatch> {
        Ok(CpuBatch {
            seq_of_token: attention::seq_of_token(batch),
            input: batch.clone(),
        })
    }

    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<CpuKvCache> {
        Ok(CpuKvCache::new(spec))
    }

    fn alloc_swap_space(&self, spec: &KvCacheSpec) -> Result<CpuKvCache> {
        Ok(CpuKvCache::new(spec))
    }

    fn copy_blocks(&self, cache: &mut CpuKvCache, copies: &[BlockCopy]) -> Result<()> {
        cache.copy_blocks(copies)
    }

    fn swap_out(
        &self,
        cache: &CpuKvCache,
        swap: &mut CpuKvCache,
        copies: &[BlockCopy],
    ) -> Result<()> {
        copy_between(cache, swap, copies, "swap_out")
    }

    fn swap_in(
        &self,
        swap: &CpuKvCache,
        cache: &mut CpuKvCache,
        copies: &[BlockCopy],
    ) -> Result<()> {
        copy_between(swap, cache, copies, "swap_in")
    }

    fn to_host(&self, t: &CpuTensor) -> Result<HostTensor> {
        Ok(HostTensor::new(t.shape.clone(), t.f32("to_host")?.to_vec()))
    }

    fn embedding(&self, table: &CpuTensor, batch: &CpuBatch) -> Result<CpuTensor> {
        let (vocab, d) = table.rows_cols();
        BackendError::check_indices("embedding", "token id", &batch.input.token_ids, vocab)
            .map_err(|e| e.on("cpu"))?;
        let data = match &table.storage {
            Storage::F32(t) => ops::gather_rows(t, d, &batch.input.token_ids),
            Storage::Packed {
                dtype,
                data,
                layout: Layout::Rows,
            } if quant::has_f32_kernels(*dtype) => {
                quant::gather_rows_packed(data, *dtype, d, &batch.input.token_ids)
            }
            Storage::Packed {
                dtype,
                data,
                layout,
            } => qdot::gather_rows_in(data, *layout, *dtype, d, &batch.input.token_ids),
        };
        Ok(CpuTensor::new(vec![batch.input.num_tokens(), d], data))
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuTensor, eps: f32) -> Result<CpuTensor> {
        let (_, d) = x.rows_cols();
        let n = w.shape.iter().product::<usize>();
        if n == 0 || !d.is_multiple_of(n) {
            return Err(BackendError::shape(
                "rms_norm",
                &[("x", &x.shape), ("weight", &w.shape)],
                "a row of x is a whole number of weight vectors",
            )
            .on("cpu"));
        }
        Ok(CpuTensor::new(
            x.shape.clone(),
            ops::rms_norm(x.f32("rms_norm")?, w.f32("rms_norm")?, eps),
        ))
    }

    fn matmul(&self, x: &CpuTensor, w: &CpuTensor) -> Result<CpuTensor> {
        matmul_with(x, w, HIDDEN_ACTIVATIONS, None)
    }

    /// One parallel region for all of them, so the threads wake once, not once per matmul;
    /// the activations are quantized once for all of them.
    fn matmul_many(&self, x: &CpuTensor, ws: &[&CpuTensor]) -> Result<Vec<CpuTensor>> {
        use rayon::prelude::*;
        let weights: Vec<(GgmlType, Layout)> =
            ws.iter().filter_map(|w| reads_quantized(w)).collect();
        let prepared = if weights.is_empty() {
            None
        } else {
            let (m, k) = x.rows_cols();
            Some(qdot::Prepared::new(
                HIDDEN_ACTIVATIONS,
                x.f32("matmul")?,
                m,
                k,
                &weights,
            ))
        };
        ws.par_iter()
            .map(|w| matmul_with(x, w, HIDDEN_ACTIVATIONS, prepared.as_ref()))
            .collect()
    }

    fn matmul_logits(&self, x: &CpuTensor, w: &CpuTensor) -> Result<CpuTensor> {
        matmul_with(x, w, Activations::Int16, None)
    }

    fn add_bias(&self, x: &mut CpuTensor, bias: &CpuTensor) -> Result<()> {
        if x.rows_cols().1 != bias.shape.iter().product::<usize>() {
            return Err(BackendError::shape(
                "add_bias",
                &[("x", &x.shape), ("bias", &bias.shape)],
                "one bias per column of x",
            )
            .on("cpu"));
        }
        ops::add_bias(x.f32_mut("add_bias")?, bias.f32("add_bias")?);
        Ok(())
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        BackendError::check_same_shape("add_assign", ("x", &x.shape), ("y", &y.shape))
            .map_err(|e| e.on("cpu"))?;
        ops::add_assign(x.f32_mut("add")?, y.f32("add")?);
        Ok(())
    }

    fn silu_mul(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        BackendError::check_same_shape("silu_mul", ("gate", &gate.shape), ("up", &up.shape))
            .map_err(|e| e.on("cpu"))?;
        Ok(CpuTensor::new(
            gate.shape.clone(),
            ops::silu_mul(gate.f32("silu_mul")?, up.f32("silu_mul")?),
        ))
    }

    fn gelu_tanh_mul(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        BackendError::check_same_shape("gelu_tanh_mul", ("gate", &gate.shape), ("up", &up.shape))
            .map_err(|e| e.on("cpu"))?;
        Ok(CpuTensor::new(
            gate.shape.clone(),
            ops::gelu_tanh_mul(gate.f32("gelu_tanh_mul")?, up.f32("gelu_tanh_mul")?),
        ))
    }

    fn swiglu_clamped(
        &self,
        gate: &CpuTensor,
        up: &CpuTensor,
        alpha: f32,
        limit: f32,
    ) -> Result<CpuTensor> {
        BackendError::check_same_shape("swiglu_clamped", ("gate", &gate.shape), ("up", &up.shape))
            .map_err(|e| e.on("cpu"))?;
        Ok(CpuTensor::new(
            gate.shape.clone(),
            ops::swiglu_clamped(
                gate.f32("swiglu_clamped")?,
                up.f32("swiglu_clamped")?,
                alpha,
                limit,
            ),
        ))
    }

    fn scale(&self, x: &mut CpuTensor, s: f32) -> Result<()> {
        ops::scale(x.f32_mut("scale")?, s);
        Ok(())
    }

    fn softcap(&self, x: &mut CpuTensor, cap: f32) -> Result<()> {
        ops::softcap(x.f32_mut("softcap")?, cap);
        Ok(())
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        batch: &CpuBatch,
        cos_sin: &CpuTensor,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let (rows, cols) = x.rows_cols();
        let (max_pos, rotary_dim) = cos_sin.rows_cols();
        if rows != batch.input.num_tokens()
            || head_dim == 0
            || !cols.is_multiple_of(head_dim)
            || rotary_dim > head_dim
            || !rotary_dim.is_multiple_of(2)
        {
            return Err(BackendError::shape(
                "rope",
                &[("x", &x.shape), ("cos_sin", &cos_sin.shape)],
                format!(
                    "x [{} tokens, heads × {head_dim}], cos_sin [positions, an even rotary dim ≤ {head_dim}]",
                    batch.input.num_tokens()
                ),
            )
            .on("cpu"));
        }
        BackendError::check_indices("rope", "position", &batch.input.positions, max_pos)
            .map_err(|e| e.on("cpu"))?;
        let table = cos_sin.f32("rope")?;
        ops::rope(
            x.f32_mut("rope")?,
            &batch.input.positions,
            table,
            head_dim,
            rotary_dim,
            style,
        );
        Ok(())
    }

    fn write_kv(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        k: &CpuTensor,
        v: &CpuTensor,
        batch: &CpuBatch,
    ) -> Result<()> {
        check_layer("write_kv", cache, layer)?;
        let s = cache.spec;
        let kv_dim = s.num_kv_heads * s.head_dim;
        let slots = s.num_blocks * s.block_size;
        if k.shape != [batch.input.num_tokens(), kv_dim] || v.shape != k.shape {
            return Err(BackendError::shape(
                "write_kv",
                &[("k", &k.shape), ("v", &v.shape)],
                format!("k and v [{} tokens, {kv_dim}]", batch.input.num_tokens()),
            )
            .on("cpu"));
        }
        BackendError::check_indices("write_kv", "slot", &batch.input.slot_mapping, slots)
            .map_err(|e| e.on("cpu"))?;
        attention::write_kv(
            &mut cache.k[layer],
            k.f32("write_kv")?,
            &batch.input.slot_mapping,
            kv_dim,
        );
        attention::write_kv(
            &mut cache.v[layer],
            v.f32("write_kv")?,
            &batch.input.slot_mapping,
            kv_dim,
        );
        Ok(())
    }

    fn paged_attention(
        &self,
        q: &CpuTensor,
        cache: &CpuKvCache,
        layer: usize,
        batch: &CpuBatch,
        p: &AttentionParams,
        sinks: Option<&CpuTensor>,
    ) -> Result<CpuTensor> {
        check_layer("paged_attention", cache, layer)?;
        let sinks = sinks.map(|s| s.f32("paged_attention")).transpose()?;
        if sinks.is_some_and(|s| s.len() != p.num_heads) {
            return Err(BackendError::count(
                "paged_attention",
                "sinks",
                sinks.map_or(0, <[f32]>::len),
                p.num_heads,
            )
            .on("cpu"));
        }
        let s = cache.spec;
        if q.shape != [batch.input.num_tokens(), p.num_heads * p.head_dim]
            || p.num_kv_heads != s.num_kv_heads
            || p.head_dim != s.head_dim
            || !p.num_heads.is_multiple_of(p.num_kv_heads)
            || batch.input.block_size != s.block_size
        {
            return Err(BackendError::shape(
                "paged_attention",
                &[("q", &q.shape)],
                format!(
                    "q [{} tokens, {} heads × {}] with {p:?} over {s:?}",
                    batch.input.num_tokens(),
                    p.num_heads,
                    p.head_dim
                ),
            )
            .on("cpu"));
        }
        let blocks = &batch.input.block_tables;
        BackendError::check_indices("paged_attention", "block", blocks, s.num_blocks)
            .map_err(|e| e.on("cpu"))?;
        let out = attention::paged_attention(
            q.f32("paged_attention")?,
            &cache.k[layer],
            &cache.v[layer],
            &batch.input,
            &batch.seq_of_token,
            p,
            sinks,
        );
        Ok(CpuTensor::new(q.shape.clone(), out))
    }

    fn all_reduce_sum(&self, x: &mut CpuTensor) -> Result<()> {
        match &self.group {
            Some(group) => group.all_reduce_sum(x.f32_mut("all_reduce_sum")?),
            None => Err(InferError::Distributed(
                "the cpu backend was built without a process group".into(),
            )),
        }
    }

    fn moe_route(&self, logits: &CpuTensor, routing: &MoeRouting) -> Result<HostRouting> {
        let (_, cols) = logits.rows_cols();
        if cols != routing.num_experts {
            return Err(BackendError::shape(
                "moe_route",
                &[("logits", &logits.shape)],
                format!("logits [tokens, {} experts]", routing.num_experts),
            )
            .on("cpu"));
        }
        routing.route(logits.f32("moe_route")?)
    }

    fn routing_to_host(&self, routing: &HostRouting) -> Result<HostRouting> {
        Ok(routing.clone())
    }

    fn moe_matmul(
        &self,
        x: &CpuTensor,
        experts: &CpuTensor,
        routing: &HostRouting,
    ) -> Result<CpuTensor> {
        moe::moe_matmul(x, experts, routing)
    }

    fn moe_add_bias(
        &self,
        y: &mut CpuTensor,
        bias: &CpuTensor,
        routing: &HostRouting,
    ) -> Result<()> {
        moe::moe_add_bias(y, bias, routing)
    }

    fn moe_combine(&self, y: &CpuTensor, routing: &HostRouting) -> Result<CpuTensor> {
        moe::moe_combine(y, routing)
    }

    fn gather_logit_rows(&self, x: &CpuTensor, batch: &CpuBatch) -> Result<CpuTensor> {
        let (rows, d) = x.rows_cols();
        let indices = &batch.input.logits_indices;
        BackendError::check_indices("gather_logit_rows", "row", indices, rows)
            .map_err(|e| e.on("cpu"))?;
        let data = ops::gather_rows(x.f32("gather_logit_rows")?, d, &batch.input.logits_indices);
        Ok(CpuTensor::new(
            vec![batch.input.logits_indices.len(), d],
            data,
        ))
    }
}
