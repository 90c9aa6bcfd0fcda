// x[r, c] += bias[c] for every row.
struct Params { len: u32, cols: u32, row_stride: u32, _pad: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i < p.len) {
        x[i] += bias[i % p.cols];
    }
}
