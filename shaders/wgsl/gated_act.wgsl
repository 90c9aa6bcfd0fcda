// out = act(gate) * up, element-wise: the gated MLP's activation. `act` 0 is SiLU (SwiGLU),
// 1 is GELU's tanh approximation (GeGLU, Gemma), 2 gpt-oss's clamped SwiGLU:
// (clamp(up, ±limit) + 1) · g · σ(alpha · g) with g = min(gate, limit).
struct Params { len: u32, row_stride: u32, act: u32, _pad: u32, alpha: f32, limit: f32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> gate: array<f32>;
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

override WG: u32 = 64u;

// tanh saturates to ±1 in f32 past |v| = 9; clamping keeps implementations that compute it
// from exponentials away from inf / inf.
fn tanh_safe(v: f32) -> f32 {
    return tanh(clamp(v, -15.0, 15.0));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i < p.len) {
        let g = gate[i];
        if (p.act == 2u) {
            let gc = min(g, p.limit);
            let u = clamp(up[i], -p.limit, p.limit);
            out[i] = (u + 1.0) * gc / (1.0 + exp(-p.alpha * gc));
            return;
        }
        var a: f32;
        if (p.act == 1u) {
            a = 0.5 * g * (1.0 + tanh_safe(0.7978846 * (g + 0.044715 * g * g * g)));
        } else {
            a = g / (1.0 + exp(-g));
        }
        out[i] = a * up[i];
    }
}
