// PagedAttention, pass 1 of 2 (vLLM's v2 scheme): one workgroup per (query token, head,
// partition of PART keys). It reads K/V through the sequence's block table, keeps the
// partition's scores in workgroup memory and writes the partition's max, sum of exponentials
// and unnormalized output; `attention_reduce` merges the partitions. A query at position p
// attends to keys 0..=p (causal), so prefill chunks and decode tokens share the kernel, or to
// the last `window` of them (sliding-window layers; 0 = no window). Scores are soft-capped to
// `softcap · tanh(s / softcap)` when `softcap` > 0 (Gemma 2).
struct Params {
    num_tokens: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks: u32,
    num_parts: u32,
    scale: f32,
    window: u32,
    softcap: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k_cache: array<f32>;
@group(0) @binding(2) var<storage, read> v_cache: array<f32>;
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
// Per token: (position, sequence index).
@group(0) @binding(4) var<storage, read> tokens: array<vec2<u32>>;
@group(0) @binding(5) var<storage, read_write> part_out: array<f32>;
// Per (token, head, partition): (max, sum of exp).
@group(0) @binding(6) var<storage, read_write> part_ml: array<vec2<f32>>;
@group(0) @binding(7) var<uniform> p: Params;

const WG: u32 = 64u;
const PART: u32 = 512u;
const MAX_HEAD_DIM: u32 = 256u;
var<workgroup> scores: array<f32, PART>;
var<workgroup> q_s: array<f32, MAX_HEAD_DIM>;
var<workgroup> red: array<f32, WG>;

fn reduce_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    // x: head, y: token, z: partition.
    let head = wid.x;
    let t = wid.y;
    let part = wid.z;
    let info = tokens[t];
    let ctx = info.x + 1u;
    let seq = info.y;
    let kvh = head / (p.heads / p.kv_heads);
    let row = p.kv_heads * p.head_dim;
    let out_idx = (t * p.heads + head) * p.num_parts + part;
    var first = 0u;
    if (p.window > 0u && ctx > p.window) {
        first = ctx - p.window;
    }
    let start = max(part * PART, first);
    let end = min(part * PART + PART, ctx);
    for (var d = lid; d < p.head_dim; d += WG) {
        q_s[d] = q[(t * p.heads + head) * p.head_dim + d];
    }
    workgroupBarrier();
    var local_max = -3.0e38;
    for (var j = start + lid; j < end; j += WG) {
        let block = block_tables[seq * p.max_blocks + j / p.block_size];
        let base = (block * p.block_size + j % p.block_size) * row + kvh * p.head_dim;
        var s = 0.0;
        for (var d = 0u; d < p.head_dim; d++) {
            s += q_s[d] * k_cache[base + d];
        }
        s *= p.scale;
        if (p.softcap > 0.0) {
            s = p.softcap * tanh(clamp(s / p.softcap, -15.0, 15.0));
        }
        scores[j - start] = s;
        local_max = max(local_max, s);
    }
    let m = reduce_max(lid, local_max);
    var local_sum = 0.0;
    for (var j = start + lid; j < end; j += WG) {
        let e = exp(scores[j - start] - m);
        scores[j - start] = e;
        local_sum += e;
    }
    let l = reduce_sum(lid, local_sum);
    // reduce_sum ended on a barrier: every score is final.
    for (var d = lid; d < p.head_dim; d += WG) {
        var acc = 0.0;
        for (var j = start; j < end; j++) {
            let block = block_tables[seq * p.max_blocks + j / p.block_size];
            let base = (block * p.block_size + j % p.block_size) * row + kvh * p.head_dim;
            acc += scores[j - start] * v_cache[base + d];
        }
        part_out[out_idx * p.head_dim + d] = acc;
    }
    if (lid == 0u) {
        part_ml[out_idx] = vec2<f32>(select(-3.0e38, m, start < end), l);
    }
}
