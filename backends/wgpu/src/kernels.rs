//! One function per kernel: checks sizes, fills the kernel's parameter block (laid out as its
//! WGSL `Params` struct) and dispatches it. Outputs are fresh buffers (poisoned with NaN, so an
//! element a kernel misses shows up) or updated in place.

use bytemuck::{Pod, Zeroable};
use infer_shaders as shaders;

use crate::context::{GpuContext, GpuError, GpuResult};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params4 {
    a: u32,
    b: u32,
    c: u32,
    d: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct NormParams {
    cols: u32,
    rows: u32,
    eps: f32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AttentionParams {
    num_tokens: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks: u32,
    num_parts: u32,
    scale: f32,
}

fn check(what: &str, ok: bool, detail: impl FnOnce() -> String) -> GpuResult<()> {
    if ok {
        Ok(())
    } else {
        Err(GpuError::Op(format!("{what}: {}", detail())))
    }
}

/// Rows of a grid over `rows` workgroups (65,535 per dimension).
fn rows_grid(rows: usize) -> (u32, u32, u32) {
    let rows = rows as u32;
    (rows.min(65_535), rows.div_ceil(65_535).max(1), 1)
}

impl GpuContext {
    /// `out[t] = table[ids[t]]`, `[num_tokens, hidden]`.
    pub fn embedding(
        &self,
        table: &wgpu::Buffer,
        hidden: usize,
        ids: &wgpu::Buffer,
        num_tokens: usize,
    ) -> wgpu::Buffer {
        let out = self.poisoned_f32(num_tokens * hidden);
        let (grid, stride) = Self::grid_1d(num_tokens * hidden);
        let p = self.uniform(&Params4 {
            a: hidden as u32,
            b: num_tokens as u32,
            c: stride,
            d: 0,
        });
        self.dispatch(&shaders::EMBEDDING, "main", &[table, ids, &out, &p], grid);
        out
    }

    pub fn rms_norm(
        &self,
        x: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> wgpu::Buffer {
        let out = self.poisoned_f32(rows * cols);
        let p = self.uniform(&NormParams {
            cols: cols as u32,
            rows: rows as u32,
            eps,
            _pad: 0,
        });
        self.dispatch(
            &shaders::RMS_NORM,
            "main",
            &[x, weight, &out, &p],
            rows_grid(rows),
        );
        out
    }

    /// `x [m, k] · w [n, k]ᵀ`.
    pub fn matmul(
        &self,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
        m: usize,
        n: usize,
        k: usize,
    ) -> wgpu::Buffer {
        let out = self.poisoned_f32(m * n);
        let p = self.uniform(&Params4 {
            a: m as u32,
            b: n as u32,
            c: k as u32,
            d: 0,
        });
        let grid = ((n as u32).div_ceil(16), (m as u32).div_ceil(16), 1);
        self.dispatch(&shaders::MATMUL, "main", &[x, w, &out, &p], grid);
        out
    }

    /// `x += y`.
    pub fn add_assign(&self, x: &wgpu::Buffer, y: &wgpu::Buffer, len: usize) {
        let (grid, stride) = Self::grid_1d(len);
        let p = self.uniform(&Params4 {
            a: len as u32,
            b: stride,
            c: 0,
            d: 0,
        });
        self.dispatch(&shaders::ADD_ASSIGN, "main", &[x, y, &p], grid);
    }

    /// `x[r] += bias` for every row of `cols`.
    pub fn add_bias(&self, x: &wgpu::Buffer, bias: &wgpu::Buffer, len: usize, cols: usize) {
        let (grid, stride) = Self::grid_1d(len);
        let p = self.uniform(&Params4 {
            a: len as u32,
            b: cols.max(1) as u32,
            c: stride,
            d: 0,
        });
        self.dispatch(&shaders::ADD_BIAS, "main", &[x, bias, &p], grid);
    }

    /// `silu(gate) * up`.
    pub fn silu_mul(&self, gate: &wgpu::Buffer, up: &wgpu::Buffer, len: usize) -> wgpu::Buffer {
        let out = self.poisoned_f32(len);
        let (grid, stride) = Self::grid_1d(len);
        let p = self.uniform(&Params4 {
            a: len as u32,
            b: stride,
            c: 0,
            d: 0,
        });
        self.dispatch(&shaders::SILU_MUL, "main", &[gate, up, &out, &p], grid);
        out
    }

    /// Rotates `x [num_tokens, heads * head_dim]` in place at `positions`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &wgpu::Buffer,
        positions: &wgpu::Buffer,
        cos_sin: &wgpu::Buffer,
        num_tokens: usize,
        heads: usize,
        head_dim: usize,
        adjacent_pairs: bool,
    ) {
        let (grid, _) = Self::grid_1d(num_tokens * heads * head_dim / 2);
        let p = self.uniform(&Params4 {
            a: num_tokens as u32,
            b: heads as u32,
            c: head_dim as u32,
            d: u32::from(adjacent_pairs),
        });
        self.dispatch(&shaders::ROPE, "main", &[x, positions, cos_sin, &p], grid);
    }

    /// Stores `k`, `v` rows of `row` floats at `slots` of one layer's cache.
    #[allow(clippy::too_many_arguments)]
    pub fn write_kv(
        &self,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        slots: &wgpu::Buffer,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        num_tokens: usize,
        row: usize,
    ) {
        let (grid, stride) = Self::grid_1d(num_tokens * row);
        let p = self.uniform(&Params4 {
            a: num_tokens as u32,
            b: row as u32,
            c: stride,
            d: 0,
        });
        self.dispatch(
            &shaders::WRITE_KV,
            "main",
            &[k, v, slots, k_cache, v_cache, &p],
            grid,
        );
    }

    /// Causal attention over the paged cache; `tokens` holds (position, sequence) per token.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        q: &wgpu::Buffer,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        block_tables: &wgpu::Buffer,
        tokens: &wgpu::Buffer,
        shape: AttentionShape,
    ) -> GpuResult<wgpu::Buffer> {
        let s = shape;
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
        let part_out = self.poisoned_f32(rows * s.head_dim);
        let part_ml = self.poisoned_f32(rows * 2);
        let p = self.uniform(&AttentionParams {
            num_tokens: s.num_tokens as u32,
            heads: s.heads as u32,
            kv_heads: s.kv_heads as u32,
            head_dim: s.head_dim as u32,
            block_size: s.block_size as u32,
            max_blocks: s.max_blocks as u32,
            num_parts: num_parts as u32,
            scale: s.scale,
        });
        let grid = (s.heads as u32, s.num_tokens as u32, num_parts as u32);
        self.dispatch(
            &shaders::PAGED_ATTENTION,
            "main",
            &[
                q,
                k_cache,
                v_cache,
                block_tables,
                tokens,
                &part_out,
                &part_ml,
                &p,
            ],
            grid,
        );
        let out = self.poisoned_f32(s.num_tokens * s.heads * s.head_dim);
        let p = self.uniform(&Params4 {
            a: s.num_tokens as u32,
            b: s.heads as u32,
            c: s.head_dim as u32,
            d: num_parts as u32,
        });
        let grid = (s.heads as u32, s.num_tokens as u32, 1);
        self.dispatch(
            &shaders::ATTENTION_REDUCE,
            "main",
            &[&part_out, &part_ml, &out, &p],
            grid,
        );
        Ok(out)
    }

    /// `out[i] = x[indices[i]]`, rows of `cols`.
    pub fn gather_rows(
        &self,
        x: &wgpu::Buffer,
        indices: &wgpu::Buffer,
        num_rows: usize,
        cols: usize,
    ) -> wgpu::Buffer {
        let out = self.poisoned_f32(num_rows * cols);
        let (grid, stride) = Self::grid_1d(num_rows * cols);
        let p = self.uniform(&Params4 {
            a: cols as u32,
            b: num_rows as u32,
            c: stride,
            d: 0,
        });
        self.dispatch(&shaders::GATHER_ROWS, "main", &[x, indices, &out, &p], grid);
        out
    }

    /// Index of each row's largest value (lowest on ties).
    pub fn argmax(&self, x: &wgpu::Buffer, rows: usize, cols: usize) -> wgpu::Buffer {
        let out = self.upload_u32(&vec![u32::MAX; rows.max(1)]);
        let p = self.uniform(&Params4 {
            a: cols as u32,
            b: rows as u32,
            c: 0,
            d: 0,
        });
        self.dispatch(
            &shaders::ARGMAX,
            "main",
            &[x, &out, &p],
            (rows as u32, 1, 1),
        );
        out
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
}
