//! The CPU backend: pure Rust, f32, multithreaded with rayon (GEMMs through the `gemm` crate).
//! It is the reference every other backend is tested against, and the fallback without a GPU.

mod attention;
mod matmul;
mod ops;

use infer_core::{
    AttentionParams, Backend, BatchInput, DeviceTensor, HostTensor, InferError, KvCacheSpec,
    Result, RopeStyle,
};

pub use matmul::matmul;

#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl CpuTensor {
    fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        CpuTensor { shape, data }
    }

    /// Rows and row length of a tensor seen as a matrix (last dim = columns).
    fn rows_cols(&self) -> (usize, usize) {
        let cols = self.shape.last().copied().unwrap_or(1);
        (self.data.len() / cols.max(1), cols)
    }

    pub fn data(&self) -> &[f32] {
        &self.data
    }
}

impl DeviceTensor for CpuTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
}

pub struct CpuKvCache {
    spec: KvCacheSpec,
    /// Per layer `[num_blocks, block_size, kv_heads, head_dim]`.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }
}

fn shape_err(op: &str, detail: String) -> InferError {
    InferError::Backend {
        backend: "cpu",
        message: format!("{op}: {detail}"),
    }
}

fn check_layer(cache: &CpuKvCache, layer: usize) -> Result<()> {
    if layer >= cache.spec.num_layers {
        return Err(shape_err(
            "kv cache",
            format!("layer {layer} of {}", cache.spec.num_layers),
        ));
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Batch = BatchInput;
    type KvCache = CpuKvCache;

    fn name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn upload(&self, t: &HostTensor) -> Result<CpuTensor> {
        Ok(CpuTensor::new(t.shape.clone(), t.data.clone()))
    }

    fn upload_batch(&self, batch: &BatchInput) -> Result<BatchInput> {
        Ok(batch.clone())
    }

    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<CpuKvCache> {
        let per_layer = spec.num_blocks * spec.block_size * spec.num_kv_heads * spec.head_dim;
        Ok(CpuKvCache {
            spec: *spec,
            k: vec![vec![0f32; per_layer]; spec.num_layers],
            v: vec![vec![0f32; per_layer]; spec.num_layers],
        })
    }

    fn to_host(&self, t: &CpuTensor) -> Result<HostTensor> {
        Ok(HostTensor::new(t.shape.clone(), t.data.clone()))
    }

    fn embedding(&self, table: &CpuTensor, batch: &BatchInput) -> Result<CpuTensor> {
        let (vocab, d) = table.rows_cols();
        if let Some(t) = batch.token_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(shape_err(
                "embedding",
                format!("token {t} >= vocab {vocab}"),
            ));
        }
        let data = ops::gather_rows(&table.data, d, &batch.token_ids);
        Ok(CpuTensor::new(vec![batch.num_tokens(), d], data))
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuTensor, eps: f32) -> Result<CpuTensor> {
        let (_, d) = x.rows_cols();
        if w.data.len() != d {
            return Err(shape_err(
                "rms_norm",
                format!("x {:?} weight {:?}", x.shape, w.shape),
            ));
        }
        Ok(CpuTensor::new(
            x.shape.clone(),
            ops::rms_norm(&x.data, &w.data, eps),
        ))
    }

    fn matmul(&self, x: &CpuTensor, w: &CpuTensor) -> Result<CpuTensor> {
        let (m, k) = x.rows_cols();
        let (n, wk) = w.rows_cols();
        if k != wk {
            return Err(shape_err(
                "matmul",
                format!("x {:?} · w {:?}ᵀ", x.shape, w.shape),
            ));
        }
        Ok(CpuTensor::new(
            vec![m, n],
            matmul::matmul(&x.data, &w.data, m, k, n),
        ))
    }

    fn add_bias(&self, x: &mut CpuTensor, bias: &CpuTensor) -> Result<()> {
        if x.rows_cols().1 != bias.data.len() {
            return Err(shape_err(
                "add_bias",
                format!("x {:?} bias {:?}", x.shape, bias.shape),
            ));
        }
        ops::add_bias(&mut x.data, &bias.data);
        Ok(())
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        if x.shape != y.shape {
            return Err(shape_err("add", format!("{:?} + {:?}", x.shape, y.shape)));
        }
        ops::add_assign(&mut x.data, &y.data);
        Ok(())
    }

    fn silu_mul(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        if gate.shape != up.shape {
            return Err(shape_err(
                "silu_mul",
                format!("{:?} vs {:?}", gate.shape, up.shape),
            ));
        }
        Ok(CpuTensor::new(
            gate.shape.clone(),
            ops::silu_mul(&gate.data, &up.data),
        ))
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        batch: &BatchInput,
        cos_sin: &CpuTensor,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let (rows, cols) = x.rows_cols();
        let max_pos = cos_sin.rows_cols().0;
        if rows != batch.num_tokens()
            || !cols.is_multiple_of(head_dim)
            || cos_sin.rows_cols().1 != head_dim
        {
            return Err(shape_err(
                "rope",
                format!(
                    "x {:?} head_dim {head_dim} for {} tokens",
                    x.shape,
                    batch.num_tokens()
                ),
            ));
        }
        if let Some(p) = batch.positions.iter().find(|&&p| p as usize >= max_pos) {
            return Err(shape_err(
                "rope",
                format!("position {p} beyond the table of {max_pos}"),
            ));
        }
        ops::rope(
            &mut x.data,
            &batch.positions,
            &cos_sin.data,
            head_dim,
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
        batch: &BatchInput,
    ) -> Result<()> {
        check_layer(cache, layer)?;
        let s = cache.spec;
        let kv_dim = s.num_kv_heads * s.head_dim;
        let slots = s.num_blocks * s.block_size;
        if k.shape != [batch.num_tokens(), kv_dim] || v.shape != k.shape {
            return Err(shape_err(
                "write_kv",
                format!("k {:?} v {:?}, kv_dim {kv_dim}", k.shape, v.shape),
            ));
        }
        if let Some(slot) = batch.slot_mapping.iter().find(|&&x| x as usize >= slots) {
            return Err(shape_err(
                "write_kv",
                format!("slot {slot} outside the cache of {slots}"),
            ));
        }
        attention::write_kv(&mut cache.k[layer], &k.data, &batch.slot_mapping, kv_dim);
        attention::write_kv(&mut cache.v[layer], &v.data, &batch.slot_mapping, kv_dim);
        Ok(())
    }

    fn paged_attention(
        &self,
        q: &CpuTensor,
        cache: &CpuKvCache,
        layer: usize,
        batch: &BatchInput,
        p: &AttentionParams,
    ) -> Result<CpuTensor> {
        check_layer(cache, layer)?;
        let s = cache.spec;
        if q.shape != [batch.num_tokens(), p.num_heads * p.head_dim]
            || p.num_kv_heads != s.num_kv_heads
            || p.head_dim != s.head_dim
            || !p.num_heads.is_multiple_of(p.num_kv_heads)
            || batch.block_size != s.block_size
        {
            return Err(shape_err(
                "paged_attention",
                format!("q {:?} with {p:?} over {s:?}", q.shape),
            ));
        }
        if let Some(b) = batch
            .block_tables
            .iter()
            .find(|&&b| b as usize >= s.num_blocks)
        {
            return Err(shape_err(
                "paged_attention",
                format!("block {b} outside the cache of {}", s.num_blocks),
            ));
        }
        let out = attention::paged_attention(&q.data, &cache.k[layer], &cache.v[layer], batch, p);
        Ok(CpuTensor::new(q.shape.clone(), out))
    }

    fn gather_logit_rows(&self, x: &CpuTensor, batch: &BatchInput) -> Result<CpuTensor> {
        let (rows, d) = x.rows_cols();
        if let Some(r) = batch.logits_indices.iter().find(|&&r| r as usize >= rows) {
            return Err(shape_err("gather_logit_rows", format!("row {r} of {rows}")));
        }
        let data = ops::gather_rows(&x.data, d, &batch.logits_indices);
        Ok(CpuTensor::new(vec![batch.logits_indices.len(), d], data))
    }
}
