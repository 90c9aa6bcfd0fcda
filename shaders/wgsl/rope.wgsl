// Rotary embedding in place on x [num_tokens, heads * head_dim] at each token's position, with
// the [max_len, rotary_dim] table (cos in the first half, sin in the second): the first
// rotary_dim dimensions of each head rotate, the rest pass through. `adjacent` = 1 rotates
// pairs (2i, 2i+1) (GGUF's permuted Llama rows), 0 rotates (i, i + rotary_dim/2) (HF layout).
struct Params {
    num_tokens: u32,
    heads: u32,
    head_dim: u32,
    adjacent: u32,
    rotary_dim: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> positions: array<u32>;
@group(0) @binding(2) var<storage, read> cos_sin: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let half = p.rotary_dim / 2u;
    let i = gid.y * nw.x * WG + gid.x;
    if (i >= p.num_tokens * p.heads * half) {
        return;
    }
    let pair = i % half;
    let head = (i / half) % p.heads;
    let t = i / (half * p.heads);
    let base = (t * p.heads + head) * p.head_dim;
    var ia = base + pair;
    var ib = base + pair + half;
    if (p.adjacent == 1u) {
        ia = base + 2u * pair;
        ib = ia + 1u;
    }
    let row = positions[t] * p.rotary_dim;
    let c = cos_sin[row + pair];
    let s = cos_sin[row + half + pair];
    let x0 = x[ia];
    let x1 = x[ib];
    x[ia] = x0 * c - x1 * s;
    x[ib] = x0 * s + x1 * c;
}
