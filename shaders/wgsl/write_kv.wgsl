// Stores this step's K and V rows [num_tokens, kv_heads * head_dim] into one layer's paged cache
// at each token's slot (block * block_size + offset): cache rows are [slot, kv_heads * head_dim].
struct Params { num_tokens: u32, row: u32, row_stride: u32, _pad: u32 }

@group(0) @binding(0) var<storage, read> k: array<f32>;
@group(0) @binding(1) var<storage, read> v: array<f32>;
@group(0) @binding(2) var<storage, read> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i >= p.num_tokens * p.row) {
        return;
    }
    let t = i / p.row;
    let dst = slots[t] * p.row + i % p.row;
    k_cache[dst] = k[i];
    v_cache[dst] = v[i];
}
