// Copy-on-write block copies inside one cache buffer (WebGPU forbids a buffer-to-buffer copy
// within the same buffer): cache[to block] = cache[from block] for each (from, to) pair.
// Destinations are freshly allocated blocks, never a source of the same step.
struct Params { block_floats: u32, num_pairs: u32, row_stride: u32, _pad: u32 }

@group(0) @binding(0) var<storage, read> pairs: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> cache: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i >= p.block_floats * p.num_pairs) {
        return;
    }
    let pair = pairs[i / p.block_floats];
    let offset = i % p.block_floats;
    cache[pair.y * p.block_floats + offset] = cache[pair.x * p.block_floats + offset];
}
