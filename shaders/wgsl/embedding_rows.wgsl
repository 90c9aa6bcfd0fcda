// out[t, :] = table[ids[t], :] for the tokens whose id falls in this part of the table (rows
// row_begin..row_end: a table over the storage binding limit is split by rows), a vec4 at a
// time. Needs hidden % 4 == 0. `w4` (the table storage: f32 or packed f16) comes from a header.
struct Params { hidden4: u32, num_tokens: u32, row_stride: u32, row_begin: u32, row_end: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i >= p.hidden4 * p.num_tokens) {
        return;
    }
    let id = ids[i / p.hidden4];
    if (id >= p.row_begin && id < p.row_end) {
        out[i] = w4((id - p.row_begin) * p.hidden4 + i % p.hidden4);
    }
}
