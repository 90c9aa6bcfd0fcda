// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight: one workgroup per row.
struct Params { cols: u32, rows: u32, eps: f32, _pad: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 256u;
var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.x + wid.y * 65535u;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var sum = 0.0;
    for (var c = lid.x; c < p.cols; c += WG) {
        let v = x[base + c];
        sum += v * v;
    }
    partial[lid.x] = sum;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lid.x < stride) {
            partial[lid.x] += partial[lid.x + stride];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(partial[0] / f32(p.cols) + p.eps);
    for (var c = lid.x; c < p.cols; c += WG) {
        out[base + c] = x[base + c] * inv * weight[c];
    }
}
