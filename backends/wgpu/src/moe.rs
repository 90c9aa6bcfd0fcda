//! The routed MLP's ops on wgpu: routing and grouping on the device (`moe_route.wgsl`,
//! `moe_group.wgsl`), the expert-grouped matmul (`moe_matmul.wgsl`: one dispatch per part of
//! the stacked experts, never one per expert or token) and the weighted combine. Nothing is
//! read back: the step stays one submission.

use infer_core::backend::DeviceTensor;
use infer_core::error::Result;
use infer_core::moe::{HostRouting, MoeRouting, MoeScoring};
use infer_core::BackendError;
use infer_shaders::{self as shaders, *};

use crate::context::GpuResult;
use crate::context::{gpu_err, wgpu_err};
use crate::device::WgpuBackend;
use crate::kernels::{groups_grid, u, MatrixRef, WeightStorage};
use crate::pool::GpuBuffer;
use crate::tensor::WgpuTensor;
use crate::GpuContext;

/// One layer's routing of a step, in device memory (`HostRouting`'s fields).
pub struct WgpuRouting {
    ids: GpuBuffer,
    weights: GpuBuffer,
    offsets: GpuBuffer,
    order: GpuBuffer,
    tokens: usize,
    top_k: usize,
    experts: usize,
}

impl GpuContext {
    fn moe_route(
        &self,
        logits: &GpuBuffer,
        tokens: usize,
        r: &MoeRouting,
    ) -> GpuResult<WgpuRouting> {
        let assignments = tokens * r.top_k;
        let (ids, weights) = (self.output(assignments)?, self.output(assignments)?);
        let renormalize = !matches!(r.scoring, MoeScoring::SoftmaxTopK { renormalize: false });
        let p = MoeRouteParams {
            tokens: u(tokens)?,
            experts: u(r.num_experts)?,
            top_k: u(r.top_k)?,
            renormalize: u32::from(renormalize),
        };
        let grid = groups_grid(tokens.div_ceil(64));
        self.dispatch(
            &shaders::MOE_ROUTE,
            "main",
            &[logits, &ids, &weights],
            &p,
            grid,
        )?;
        let (offsets, order) = (self.output(r.num_experts + 1)?, self.output(assignments)?);
        let p = MoeGroupParams {
            assignments: u(assignments)?,
            experts: u(r.num_experts)?,
            ..Default::default()
        };
        self.dispatch(
            &shaders::MOE_GROUP,
            "main",
            &[&ids, &offsets, &order],
            &p,
            (1, 1, 1),
        )?;
        Ok(WgpuRouting {
            ids,
            weights,
            offsets,
            order,
            tokens,
            top_k: r.top_k,
            experts: r.num_experts,
        })
    }

    /// `experts` is the `[experts · n, k]` stacked matrix; `per_token` whether `x` has a row
    /// per token (else one per assignment).
    fn moe_matmul(
        &self,
        x: &GpuBuffer,
        experts: &MatrixRef,
        n: usize,
        r: &WgpuRouting,
        per_token: bool,
    ) -> GpuResult<GpuBuffer> {
        let out = self.output(r.tokens * r.top_k * n)?;
        let kernel = match experts.storage {
            WeightStorage::F32 => &shaders::MOE_MATMUL_F32,
            WeightStorage::F16 => &shaders::MOE_MATMUL_F16,
        };
        let tiles = n.div_ceil(8);
        for (part, first, rows) in experts.parts() {
            // The experts whose rows this part holds.
            let (e0, e1) = (first / n, (first + rows - 1) / n);
            let p = MoeMatmulParams {
                n: u(n)?,
                k: u(experts.cols)?,
                top_k: u(r.top_k)?,
                per_token: u32::from(per_token),
                first: u(first)?,
                rows: u(rows)?,
                tiles: u(tiles)?,
                e0: u(e0)?,
            };
            let grid = groups_grid((e1 - e0 + 1) * tiles);
            let bound = [x, part, &out, &r.offsets, &r.order];
            self.dispatch(kernel, "main", &bound, &p, grid)?;
        }
        Ok(out)
    }

    fn moe_add_bias(
        &self,
        y: &GpuBuffer,
        bias: &GpuBuffer,
        r: &WgpuRouting,
        cols: usize,
    ) -> GpuResult<()> {
        let len = r.tokens * r.top_k * cols;
        let (grid, stride) = Self::grid_1d(len);
        let p = AddBiasParams {
            len: u(len)?,
            cols: u(cols.max(1))?,
            row_stride: stride,
            ..Default::default()
        };
        self.dispatch(&shaders::MOE_ADD_BIAS, "main", &[y, bias, &r.ids], &p, grid)
    }

    fn moe_combine(&self, y: &GpuBuffer, r: &WgpuRouting, cols: usize) -> GpuResult<GpuBuffer> {
        let len = r.tokens * cols;
        let out = self.output(len)?;
        let (grid, stride) = Self::grid_1d(len);
        let p = MoeCombineParams {
            len: u(len)?,
            cols: u(cols)?,
            top_k: u(r.top_k)?,
            row_stride: stride,
        };
        self.dispatch(
            &shaders::MOE_COMBINE,
            "main",
            &[y, &r.weights, &out],
            &p,
            grid,
        )?;
        Ok(out)
    }
}

impl WgpuBackend {
    pub(crate) fn route(&self, logits: &WgpuTensor, r: &MoeRouting) -> Result<WgpuRouting> {
        r.validate()?;
        let (tokens, cols) = logits.rows_cols();
        if cols != r.num_experts || r.num_experts > shaders::MOE_MAX_EXPERTS {
            return Err(wgpu_err(BackendError::shape(
                "moe_route",
                &[("logits", logits.shape())],
                format!(
                    "logits [tokens, {} experts], at most {} experts",
                    r.num_experts,
                    shaders::MOE_MAX_EXPERTS
                ),
            )));
        }
        self.ctx
            .moe_route(logits.buf("moe_route")?, tokens, r)
            .map_err(gpu_err)
    }

    pub(crate) fn routing_host(&self, r: &WgpuRouting) -> Result<HostRouting> {
        let a = r.tokens * r.top_k;
        let read = |b: &GpuBuffer, n: usize| self.ctx.read_u32(b, n).map_err(gpu_err);
        Ok(HostRouting {
            top_k: r.top_k,
            ids: read(&r.ids, a)?,
            weights: self.ctx.read_f32(&r.weights, a).map_err(gpu_err)?,
            offsets: read(&r.offsets, r.experts + 1)?,
            order: read(&r.order, a)?,
        })
    }

    pub(crate) fn grouped_matmul(
        &self,
        x: &WgpuTensor,
        experts: &WgpuTensor,
        r: &WgpuRouting,
    ) -> Result<WgpuTensor> {
        let (rows, k) = x.rows_cols();
        let assignments = r.tokens * r.top_k;
        let shape_ok = matches!(experts.shape(), [e, _, wk] if *e == r.experts && *wk == k);
        if !shape_ok || !(rows == r.tokens || rows == assignments) || !k.is_multiple_of(4) {
            return Err(wgpu_err(BackendError::shape(
                "moe_matmul",
                &[("x", x.shape()), ("experts", experts.shape())],
                format!(
                    "x [{} tokens or {assignments} assignments, k] · experts [{}, n, k]ᵀ, \
                     k a multiple of 4",
                    r.tokens, r.experts
                ),
            )));
        }
        let n = experts.shape()[1];
        let out = self.ctx.moe_matmul(
            x.buf("moe_matmul")?,
            &experts.matrix(),
            n,
            r,
            rows == r.tokens,
        );
        self.out(out, vec![assignments, n])
    }

    pub(crate) fn add_expert_bias(
        &self,
        y: &mut WgpuTensor,
        bias: &WgpuTensor,
        r: &WgpuRouting,
    ) -> Result<()> {
        let (rows, cols) = y.rows_cols();
        if rows != r.tokens * r.top_k || bias.shape() != [r.experts, cols] {
            return Err(wgpu_err(BackendError::shape(
                "moe_add_bias",
                &[("y", y.shape()), ("bias", bias.shape())],
                format!(
                    "y [{} assignments, n], bias [{} experts, n]",
                    r.tokens * r.top_k,
                    r.experts
                ),
            )));
        }
        self.ctx
            .moe_add_bias(y.buf("moe_add_bias")?, bias.buf("moe_add_bias")?, r, cols)
            .map_err(gpu_err)
    }

    pub(crate) fn combine(&self, y: &WgpuTensor, r: &WgpuRouting) -> Result<WgpuTensor> {
        let (rows, cols) = y.rows_cols();
        if rows != r.tokens * r.top_k {
            return Err(wgpu_err(BackendError::shape(
                "moe_combine",
                &[("y", y.shape())],
                format!("one row for each of {} assignments", r.tokens * r.top_k),
            )));
        }
        let out = self.ctx.moe_combine(y.buf("moe_combine")?, r, cols);
        self.out(out, vec![r.tokens, cols])
    }
}
