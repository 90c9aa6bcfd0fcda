// out[i] = bitcast<f32>(bits): fills a buffer (NaN poison before a kernel under test writes it).
struct Params { len: u32, bits: u32, row_stride: u32, _pad: u32 }

@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i < p.len) {
        out[i] = p.bits;
    }
}
