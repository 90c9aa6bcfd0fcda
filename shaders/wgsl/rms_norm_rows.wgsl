// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight with one invocation per row and no
// workgroup memory or barriers: the kernel for CPU adapters (see matmul_rows.wgsl).
struct Params { cols: u32, rows: u32, eps: f32, _pad: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let row = (wid.x + wid.y * 65535u) * WG + t;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var sum = 0.0;
    for (var c = 0u; c < p.cols; c++) {
        let v = x[base + c];
        sum += v * v;
    }
    let inv = inverseSqrt(sum / f32(p.cols) + p.eps);
    for (var c = 0u; c < p.cols; c++) {
        out[base + c] = x[base + c] * inv * weight[c];
    }
}
