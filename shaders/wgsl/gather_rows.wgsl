// out[i] = x[indices[i]]: the rows whose logits are wanted.
struct Params { cols: u32, num_rows: u32, row_stride: u32, _pad: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> indices: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i >= p.cols * p.num_rows) {
        return;
    }
    out[i] = x[indices[i / p.cols] * p.cols + i % p.cols];
}
