//! The routed MLP's ops: routing on the host (`MoeRouting::route`), the expert-grouped
//! matmul, and the weighted combine. Each expert's weights stay as stored (f32 or any packed
//! GGUF type, a view of the mapped file) and are streamed once per step for all the tokens
//! routed to it; experts run in parallel, each through the dense matmul kernels.

use infer_core::moe::HostRouting;
use infer_core::{BackendError, Result};
use rayon::prelude::*;

use crate::qdot::Layout;
use crate::tensor::{CpuTensor, Storage};
use crate::{matmul, qdot, quant, HIDDEN_ACTIVATIONS};

/// `out[a] = x[row(a)] · experts[ids[a]]ᵀ` (see `Backend::moe_matmul`).
pub(crate) fn moe_matmul(x: &CpuTensor, experts: &CpuTensor, r: &HostRouting) -> Result<CpuTensor> {
    let (rows, k) = x.rows_cols();
    let assignments = r.ids.len();
    let (num_experts, n, wk) = match experts.shape.as_slice() {
        [e, n, wk] => (*e, *n, *wk),
        other => {
            return Err(BackendError::shape(
                "moe_matmul",
                &[("experts", other)],
                "experts [experts, rows, cols]",
            )
            .on("cpu"))
        }
    };
    let per_token = rows == r.num_tokens();
    if wk != k || num_experts != r.num_experts() || !(per_token || rows == assignments) {
        return Err(BackendError::shape(
            "moe_matmul",
            &[("x", &x.shape), ("experts", &experts.shape)],
            format!(
                "x [{} tokens or {assignments} assignments, k] · experts [{}, n, k]ᵀ",
                r.num_tokens(),
                r.num_experts()
            ),
        )
        .on("cpu"));
    }
    let x = x.f32("moe_matmul")?;
    let top_k = r.top_k;
    let row_of = |a: u32| {
        if per_token {
            a as usize / top_k
        } else {
            a as usize
        }
    };
    let parts: Vec<(usize, Vec<f32>)> = (0..num_experts)
        .into_par_iter()
        .filter(|&e| !r.group(e).is_empty())
        .map(|e| {
            let group = r.group(e);
            let m = group.len();
            let mut xs = Vec::with_capacity(m * k);
            for &a in group {
                let row = row_of(a);
                xs.extend_from_slice(&x[row * k..(row + 1) * k]);
            }
            let out = match &experts.storage {
                Storage::F32(w) => matmul::matmul(&xs, &w[e * n * k..(e + 1) * n * k], m, k, n),
                // `upload_packed` interleaves matrices only, never stacks of experts.
                Storage::Packed {
                    layout: Layout::Interleaved,
                    ..
                } => {
                    unreachable!("experts are kept as stored")
                }
                Storage::Packed {
                    dtype,
                    data,
                    layout: Layout::Rows,
                } => {
                    let row_bytes = dtype.row_bytes(k);
                    let w = &data[e * n * row_bytes..(e + 1) * n * row_bytes];
                    if quant::has_f32_kernels(*dtype) {
                        quant::matmul_packed(&xs, w, *dtype, m, k, n)
                    } else {
                        qdot::matmul_quantized(HIDDEN_ACTIVATIONS, &xs, w, *dtype, m, k, n)
                    }
                }
            };
            (e, out)
        })
        .collect();
    let mut out = vec![0f32; assignments * n];
    for (e, part) in parts {
        for (&a, row) in r.group(e).iter().zip(part.chunks_exact(n.max(1))) {
            out[a as usize * n..(a as usize + 1) * n].copy_from_slice(row);
        }
    }
    Ok(CpuTensor::new(vec![assignments, n], out))
}

/// `out[t] = Σₛ weights[t·k + s] · y[t·k + s]`.
pub(crate) fn moe_combine(y: &CpuTensor, r: &HostRouting) -> Result<CpuTensor> {
    let (rows, cols) = y.rows_cols();
    if rows != r.ids.len() {
        return Err(BackendError::shape(
            "moe_combine",
            &[("y", &y.shape)],
            format!("one row for each of {} assignments", r.ids.len()),
        )
        .on("cpu"));
    }
    let y = y.f32("moe_combine")?;
    let tokens = r.num_tokens();
    let mut out = vec![0f32; tokens * cols];
    out.par_chunks_mut(cols.max(1))
        .enumerate()
        .for_each(|(t, o)| {
            for s in 0..r.top_k {
                let a = t * r.top_k + s;
                let w = r.weights[a];
                for (o, v) in o.iter_mut().zip(&y[a * cols..(a + 1) * cols]) {
                    *o += w * v;
                }
            }
        });
    Ok(CpuTensor::new(vec![tokens, cols], out))
}

/// `y[a] += bias[ids[a]]`.
pub(crate) fn moe_add_bias(y: &mut CpuTensor, bias: &CpuTensor, r: &HostRouting) -> Result<()> {
    let (rows, n) = y.rows_cols();
    if rows != r.ids.len() || bias.shape != [r.num_experts(), n] {
        return Err(BackendError::shape(
            "moe_add_bias",
            &[("y", &y.shape), ("bias", &bias.shape)],
            format!(
                "y [{} assignments, n], bias [{} experts, n]",
                r.ids.len(),
                r.num_experts()
            ),
        )
        .on("cpu"));
    }
    let bias = bias.f32("moe_add_bias")?;
    let y = y.f32_mut("moe_add_bias")?;
    for (row, &e) in y.chunks_exact_mut(n.max(1)).zip(&r.ids) {
        let b = &bias[e as usize * n..(e as usize + 1) * n];
        row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
    }
    Ok(())
}
