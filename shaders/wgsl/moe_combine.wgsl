// Each token's expert outputs summed with its routing weights:
// out[t, c] = Σ_s weights[t·k + s] · y[t·k + s, c].
struct Params { len: u32, cols: u32, top_k: u32, row_stride: u32 }

@group(0) @binding(0) var<storage, read> y: array<f32>;
@group(0) @binding(1) var<storage, read> weights: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i >= p.len) {
        return;
    }
    let t = i / p.cols;
    let c = i % p.cols;
    var sum = 0.0;
    for (var s = 0u; s < p.top_k; s++) {
        let a = t * p.top_k + s;
        sum += weights[a] * y[a * p.cols + c];
    }
    out[i] = sum;
}
