// PagedAttention, pass 2 of 2: merges the partitions of each (token, head) into the output
// row [num_tokens, heads * head_dim], rescaling each partition by exp(max_p - max). With
// `has_sinks`, head h's sink logit joins the denominator (gpt-oss) and attends to nothing.
struct Params { num_tokens: u32, heads: u32, head_dim: u32, num_parts: u32, has_sinks: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> part_out: array<f32>;
@group(0) @binding(1) var<storage, read> part_ml: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> sinks: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let th = wid.y * p.heads + wid.x;
    let first = th * p.num_parts;
    var m = -3.0e38;
    for (var i = 0u; i < p.num_parts; i++) {
        m = max(m, part_ml[first + i].x);
    }
    var l = 0.0;
    if (p.has_sinks != 0u) {
        let sink = sinks[wid.x];
        m = max(m, sink);
        l = exp(sink - m);
    }
    for (var i = 0u; i < p.num_parts; i++) {
        let ml = part_ml[first + i];
        l += ml.y * exp(ml.x - m);
    }
    for (var d = lid.x; d < p.head_dim; d += WG) {
        var acc = 0.0;
        for (var i = 0u; i < p.num_parts; i++) {
            acc += part_out[(first + i) * p.head_dim + d] * exp(part_ml[first + i].x - m);
        }
        out[th * p.head_dim + d] = acc / l;
    }
}
