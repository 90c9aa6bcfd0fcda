// out = silu(gate) * up, element-wise (the SwiGLU feed-forward's activation).
struct Params { len: u32, row_stride: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<storage, read> gate: array<f32>;
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i < p.len) {
        let g = gate[i];
        out[i] = g / (1.0 + exp(-g)) * up[i];
    }
}
