// out[t, c] = table[ids[t], c]: the token embedding gather.
struct Params { hidden: u32, num_tokens: u32, row_stride: u32, _pad: u32 }

@group(0) @binding(0) var<storage, read> table: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    // 2-D dispatch: rows of `row_stride` invocations get past the 65,535-workgroup limit.
    let i = gid.y * p.row_stride + gid.x;
    if (i >= p.hidden * p.num_tokens) {
        return;
    }
    let t = i / p.hidden;
    out[i] = table[ids[t] * p.hidden + i % p.hidden];
}
