// The experts' biases: y[a, c] += bias[ids[a], c] for every assignment a (gpt-oss).
struct Params { len: u32, cols: u32, row_stride: u32, _pad: u32 }

@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i < p.len) {
        y[i] += bias[ids[i / p.cols] * p.cols + i % p.cols];
    }
}
