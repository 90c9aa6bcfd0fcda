// Element-wise ops over flat f32 buffers, one entry point each:
//   add_assign: x += y;  add_bias: x[r, c] += bias[c];  silu_mul: out = silu(a) * b.
struct Params { len: u32, cols: u32, row_stride: u32, _pad: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

override WG: u32 = 64u;

fn index(gid: vec3<u32>) -> u32 {
    return gid.y * p.row_stride + gid.x;
}

@compute @workgroup_size(WG)
fn add_assign(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.len) {
        x[i] += a[i];
    }
}

@compute @workgroup_size(WG)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.len) {
        x[i] += a[i % p.cols];
    }
}

@compute @workgroup_size(WG)
fn silu_mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < p.len) {
        let g = a[i];
        x[i] = g / (1.0 + exp(-g)) * b[i];
    }
}
