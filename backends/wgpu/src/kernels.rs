//! One function per kernel: fills the kernel's parameter block (laid out as its WGSL `Params`
//! struct) and records it into the step. Outputs come from the buffer pool; ops marked
//! in place update their first argument.

use infer_shaders::{self as shaders, *};

use crate::context::{GpuContext, GpuResult};
use crate::pool::GpuBuffer;
use infer_core::BackendError;

/// The gated MLP's activation (`gated_act.wgsl`'s `act`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GatedAct {
    Silu,
    GeluTanh,
    SwigluClamped { alpha: f32, limit: f32 },
}

/// How a weight matrix is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightStorage {
    F32,
    /// f16 pairs packed in u32 (rows need `cols % 4 == 0`).
    F16,
}

impl WeightStorage {
    pub fn bytes_per_element(self) -> usize {
        match self {
            WeightStorage::F32 => 4,
            WeightStorage::F16 => 2,
        }
    }
}

/// A `[rows, cols]` weight matrix split by rows into parts that each fit one storage binding.
pub struct MatrixRef<'a> {
    pub parts: &'a [GpuBuffer],
    /// Rows per part (the last part may hold fewer).
    pub part_rows: usize,
    /// Rows in all (of every expert, for stacked experts).
    pub rows: usize,
    pub cols: usize,
    pub storage: WeightStorage,
}

impl MatrixRef<'_> {
    /// `(buffer, first row, rows)` per part.
    pub(crate) fn parts(&self) -> impl Iterator<Item = (&GpuBuffer, usize, usize)> {
        self.parts.iter().enumerate().map(|(i, b)| {
            let first = i * self.part_rows;
            (b, first, self.part_rows.min(self.rows - first))
        })
    }
}

/// Refuses a layout the kernels of `op` do not implement.
fn check(op: &'static str, ok: bool, what: impl FnOnce() -> String) -> GpuResult<()> {
    if ok {
        Ok(())
    } else {
        Err(BackendError::unsupported(op, what()).into())
    }
}

/// A grid of `groups` workgroups, spilling past 65,535 along x into y.
pub(crate) fn groups_grid(groups: usize) -> (u32, u32, u32) {
    // Past u32 the count saturates, and `dispatch` refuses the grid as too large.
    let y = u32::try_from(groups.div_ceil(65_535)).unwrap_or(u32::MAX);
    (u32::try_from(groups.min(65_535)).unwrap_or(65_535), y, 1)
}

/// `v` as a kernel's 32-bit parameter; a shape past it is an error, never a truncated value.
pub(crate) fn u(v: usize) -> GpuResult<u32> {
    u32::try_from(v).map_err(|_| {
        BackendError::too_large("dispatch", "a kernel parameter", v as u64, u32::MAX.into()).into()
    })
}

impl GpuContext {
    /// `out[t] = table[ids[t]]`, `[num_tokens, hidden]`.
    pub fn embedding(
        &self,
        table: &MatrixRef,
        ids: &GpuBuffer,
        num_tokens: usize,
    ) -> GpuResult<GpuBuffer> {
        let hidden = table.cols;
        let out = self.output(num_tokens * hidden)?;
        if !hidden.is_multiple_of(4) {
            check(
                "embedding",
                table.parts.len() == 1 && table.storage == WeightStorage::F32,
                || format!("split or f16 table with hidden {hidden}"),
            )?;
            let (grid, stride) = Self::grid_1d(num_tokens * hidden);
            let p = EmbeddingParams {
                hidden: u(hidden)?,
                num_tokens: u(num_tokens)?,
                row_stride: stride,
                ..Default::default()
            };
            self.dispatch(
                &shaders::EMBEDDING,
                "main",
                &[&table.parts[0], ids, &out],
                &p,
                grid,
            )?;
            return Ok(out);
        }
        let kernel = match table.storage {
            WeightStorage::F32 => &shaders::EMBEDDING_ROWS_F32,
            WeightStorage::F16 => &shaders::EMBEDDING_ROWS_F16,
        };
        let (grid, stride) = Self::grid_1d(num_tokens * hidden / 4);
        for (part, first, rows) in table.parts() {
            let p = EmbeddingRowsParams {
                hidden4: u(hidden / 4)?,
                num_tokens: u(num_tokens)?,
                row_stride: stride,
                row_begin: u(first)?,
                row_end: u(first + rows)?,
                ..Default::default()
            };
            self.dispatch(kernel, "main", &[ids, part, &out], &p, grid)?;
        }
        Ok(out)
    }

    pub fn rms_norm(
        &self,
        x: &GpuBuffer,
        weight: &GpuBuffer,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> GpuResult<GpuBuffer> {
        let out = self.output(rows * cols)?;
        let p = RmsNormParams {
            cols: u(cols)?,
            rows: u(rows)?,
            eps,
            ..Default::default()
        };
        // A row per invocation (64 a workgroup) or a row per workgroup.
        let (kernel, grid) = if self.barrier_free_kernels() {
            (&shaders::RMS_NORM_ROWS, groups_grid(rows.div_ceil(64)))
        } else {
            (&shaders::RMS_NORM, groups_grid(rows))
        };
        self.dispatch(kernel, "main", &[x, weight, &out], &p, grid)?;
        Ok(out)
    }

    /// `x [m, k] · w [n, k]ᵀ`: the small-batch kernel for decode, the tiled one for prefill,
    /// the barrier-free one for both where barriers are slow, the scalar one where
    /// `k % 4 != 0`; one dispatch per part of a split weight.
    pub fn matmul(&self, x: &GpuBuffer, w: &MatrixRef, m: usize) -> GpuResult<GpuBuffer> {
        let (n, k) = (w.rows, w.cols);
        let out = self.output(m * n)?;
        let f16 = w.storage == WeightStorage::F16;
        // (kernel, output columns per workgroup, rows per workgroup: `None` for the kernels
        // that take every row in one workgroup and lay column groups out as a 1-D grid).
        let (kernel, cols_per_group, rows_per_group) = if !k.is_multiple_of(4) {
            check("matmul", !f16, || format!("f16 weights with k = {k}"))?;
            (&shaders::MATMUL, 16, Some(16))
        } else if self.barrier_free_kernels() {
            // Any m: rows go four at a time, so prefill reads the weights m / 4 times; still
            // faster there than the tiled kernel's barriers.
            let kernel = if f16 {
                &shaders::MATMUL_ROWS_F16
            } else {
                &shaders::MATMUL_ROWS_F32
            };
            (kernel, 64, None)
        } else if m <= shaders::MATMUL_SMALL_MAX_M {
            let kernel = if f16 {
                &shaders::MATMUL_SMALL_F16
            } else {
                &shaders::MATMUL_SMALL_F32
            };
            (kernel, 8, None)
        } else if f16 {
            (&shaders::MATMUL_TILED_F16, 64, Some(64))
        } else {
            (&shaders::MATMUL_TILED_F32, 64, Some(64))
        };
        for (part, first, rows) in w.parts() {
            let p = MatmulParams {
                m: u(m)?,
                n: u(rows)?,
                k: u(k)?,
                n_offset: u(first)?,
                out_stride: u(n)?,
                ..Default::default()
            };
            let col_groups = rows.div_ceil(cols_per_group);
            let grid = match rows_per_group {
                None => groups_grid(col_groups),
                Some(r) => (u(col_groups)?, u(m.div_ceil(r))?, 1),
            };
            self.dispatch(kernel, "main", &[x, part, &out], &p, grid)?;
        }
        Ok(out)
    }

    /// `x += y` (in place).
    pub fn add_assign(&self, x: &GpuBuffer, y: &GpuBuffer, len: usize) -> GpuResult<()> {
        let (grid, stride) = Self::grid_1d(len);
        let p = AddAssignParams {
            len: u(len)?,
            row_stride: stride,
            ..Default::default()
        };
        self.dispatch(&shaders::ADD_ASSIGN, "main", &[x, y], &p, grid)
    }

    /// `x[r] += bias` for every row of `cols` (in place).
    pub fn add_bias(
        &self,
        x: &GpuBuffer,
        bias: &GpuBuffer,
        len: usize,
        cols: usize,
    ) -> GpuResult<()> {
        let (grid, stride) = Self::grid_1d(len);
        let p = AddBiasParams {
            len: u(len)?,
            cols: u(cols.max(1))?,
            row_stride: stride,
            ..Default::default()
        };
        self.dispatch(&shaders::ADD_BIAS, "main", &[x, bias], &p, grid)
    }

    /// `act(gate) * up`: SiLU, or GELU-tanh when `gelu_tanh`.
    pub fn gated_act(
        &self,
        gate: &GpuBuffer,
        up: &GpuBuffer,
        len: usize,
        act: GatedAct,
    ) -> GpuResult<GpuBuffer> {
        let out = self.output(len)?;
        let (grid, stride) = Self::grid_1d(len);
        let (code, alpha, limit) = match act {
            GatedAct::Silu => (0, 0.0, 0.0),
            GatedAct::GeluTanh => (1, 0.0, 0.0),
            GatedAct::SwigluClamped { alpha, limit } => (2, alpha, limit),
        };
        let p = GatedActParams {
            len: u(len)?,
            row_stride: stride,
            act: code,
            alpha,
            limit,
            ..Default::default()
        };
        self.dispatch(&shaders::GATED_ACT, "main", &[gate, up, &out], &p, grid)?;
        Ok(out)
    }

    /// In place: `x *= value`, or `x = value · tanh(x / value)` when `softcap`.
    pub fn scale(&self, x: &GpuBuffer, len: usize, value: f32, softcap: bool) -> GpuResult<()> {
        let (grid, stride) = Self::grid_1d(len);
        let p = ScaleParams {
            len: u(len)?,
            row_stride: stride,
            softcap: u32::from(softcap),
            value,
        };
        self.dispatch(&shaders::SCALE, "main", &[x], &p, grid)
    }

    /// Rotates the first `rotary_dim` dimensions of each head of `x [num_tokens, heads *
    /// head_dim]` in place at `positions`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &GpuBuffer,
        positions: &GpuBuffer,
        cos_sin: &GpuBuffer,
        num_tokens: usize,
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
        adjacent_pairs: bool,
    ) -> GpuResult<()> {
        let (grid, _) = Self::grid_1d(num_tokens * heads * rotary_dim / 2);
        let p = RopeParams {
            num_tokens: u(num_tokens)?,
            heads: u(heads)?,
            head_dim: u(head_dim)?,
            adjacent: u32::from(adjacent_pairs),
            rotary_dim: u(rotary_dim)?,
            ..Default::default()
        };
        self.dispatch(&shaders::ROPE, "main", &[x, positions, cos_sin], &p, grid)
    }

    /// Stores `k`, `v` rows of `row` floats at `slots` of one layer's cache.
    #[allow(clippy::too_many_arguments)]
    pub fn write_kv(
        &self,
        k: &GpuBuffer,
        v: &GpuBuffer,
        slots: &GpuBuffer,
        k_cache: &GpuBuffer,
        v_cache: &GpuBuffer,
        num_tokens: usize,
        row: usize,
    ) -> GpuResult<()> {
        let (grid, stride) = Self::grid_1d(num_tokens * row);
        let p = WriteKvParams {
            num_tokens: u(num_tokens)?,
            row: u(row)?,
            row_stride: stride,
            ..Default::default()
        };
        self.dispatch(
            &shaders::WRITE_KV,
            "main",
            &[k, v, slots, k_cache, v_cache],
            &p,
            grid,
        )
    }

    /// Causal attention over the paged cache; `tokens` holds (position, sequence) per token.
    /// Pass 1 attends per partition of keys, pass 2 merges the partitions (and the sinks).
    // The buffers a dispatch binds, each its own argument (as the kernel lists them).
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        q: &GpuBuffer,
        k_cache: &GpuBuffer,
        v_cache: &GpuBuffer,
        block_tables: &GpuBuffer,
        tokens: &GpuBuffer,
        sinks: Option<&GpuBuffer>,
        s: AttentionShape,
    ) -> GpuResult<GpuBuffer> {
        check(
            "paged_attention",
            s.head_dim <= shaders::MAX_HEAD_DIM
                && s.kv_heads > 0
                && s.heads.is_multiple_of(s.kv_heads),
            || {
                format!(
                    "{} heads over {} kv heads of dim {}",
                    s.heads, s.kv_heads, s.head_dim
                )
            },
        )?;
        let num_parts = s.max_context.div_ceil(shaders::ATTENTION_PARTITION).max(1);
        let rows = s.num_tokens * s.heads * num_parts;
        let part_out = self.output(rows * s.head_dim)?;
        let part_ml = self.output(rows * 2)?;
        let p = PagedAttentionParams {
            num_tokens: u(s.num_tokens)?,
            heads: u(s.heads)?,
            kv_heads: u(s.kv_heads)?,
            head_dim: u(s.head_dim)?,
            block_size: u(s.block_size)?,
            max_blocks: u(s.max_blocks)?,
            num_parts: u(num_parts)?,
            scale: s.scale,
            window: u(s.window.unwrap_or(0))?,
            softcap: s.softcap.unwrap_or(0.0),
            ..Default::default()
        };
        let grid = (p.heads, p.num_tokens, p.num_parts);
        let bound = [
            q,
            k_cache,
            v_cache,
            block_tables,
            tokens,
            &part_out,
            &part_ml,
        ];
        self.dispatch(&shaders::PAGED_ATTENTION, "main", &bound, &p, grid)?;
        let out = self.output(s.num_tokens * s.heads * s.head_dim)?;
        let p = AttentionReduceParams {
            num_tokens: u(s.num_tokens)?,
            heads: u(s.heads)?,
            head_dim: u(s.head_dim)?,
            num_parts: u(num_parts)?,
            has_sinks: u32::from(sinks.is_some()),
            ..Default::default()
        };
        let grid = (p.heads, p.num_tokens, 1);
        // Without sinks the binding is any buffer: the kernel does not read it.
        let bound = [&part_out, &part_ml, &out, sinks.unwrap_or(&part_ml)];
        self.dispatch(&shaders::ATTENTION_REDUCE, "main", &bound, &p, grid)?;
        Ok(out)
    }

    /// `out[i] = x[indices[i]]`, rows of `cols`.
    pub fn gather_rows(
        &self,
        x: &GpuBuffer,
        indices: &GpuBuffer,
        num_rows: usize,
        cols: usize,
    ) -> GpuResult<GpuBuffer> {
        let out = self.output(num_rows * cols)?;
        let (grid, stride) = Self::grid_1d(num_rows * cols);
        let p = GatherRowsParams {
            cols: u(cols)?,
            num_rows: u(num_rows)?,
            row_stride: stride,
            ..Default::default()
        };
        self.dispatch(&shaders::GATHER_ROWS, "main", &[x, indices, &out], &p, grid)?;
        Ok(out)
    }

    /// `cache[to] = cache[from]` for whole blocks of `block_floats`, `pairs` holding
    /// `(from, to)` per copy.
    pub fn copy_blocks(
        &self,
        cache: &GpuBuffer,
        pairs: &GpuBuffer,
        num_pairs: usize,
        block_floats: usize,
    ) -> GpuResult<()> {
        let (grid, stride) = Self::grid_1d(num_pairs * block_floats);
        let p = CopyBlocksParams {
            block_floats: u(block_floats)?,
            num_pairs: u(num_pairs)?,
            row_stride: stride,
            ..Default::default()
        };
        self.dispatch(&shaders::COPY_BLOCKS, "main", &[pairs, cache], &p, grid)
    }

    /// Index of each row's largest value (lowest on ties).
    pub fn argmax(&self, x: &GpuBuffer, rows: usize, cols: usize) -> GpuResult<GpuBuffer> {
        let out = self.output(rows)?;
        let p = ArgmaxParams {
            cols: u(cols)?,
            rows: u(rows)?,
            ..Default::default()
        };
        self.dispatch(&shaders::ARGMAX, "main", &[x, &out], &p, groups_grid(rows))?;
        Ok(out)
    }
}

/// Sizes of one paged-attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub num_tokens: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Block-table row length.
    pub max_blocks: usize,
    /// Longest context in the batch (sets the number of partitions).
    pub max_context: usize,
    pub scale: f32,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}
