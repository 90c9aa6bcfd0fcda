// out[m, n_offset + n] = x[m, k] · w[n, k]ᵀ with one invocation per output column and no
// workgroup memory or barriers: the kernel for adapters that run a workgroup barrier by
// switching between invocations one at a time (SwiftShader), where the cooperative
// `matmul_small` and `matmul_tiled` are tens of times slower. Rows go four at a time, so each
// weight vector is read once per four rows (eight a pass measured no faster: the dots, not
// the weight reads, bound it there). Needs k % 4 == 0. `w4` comes from a header.
struct Params { m: u32, n: u32, k: u32, n_offset: u32, out_stride: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let col = (wid.x + wid.y * 65535u) * WG + t;
    if (col >= p.n) {
        return;
    }
    let k4 = p.k / 4u;
    for (var r0 = 0u; r0 < p.m; r0 += 4u) {
        // Rows past the last repeat it (no branch in the inner loop); only real rows are written.
        let last = p.m - 1u;
        let x0 = r0 * k4;
        let x1 = min(r0 + 1u, last) * k4;
        let x2 = min(r0 + 2u, last) * k4;
        let x3 = min(r0 + 3u, last) * k4;
        var acc = vec4<f32>(0.0);
        for (var q = 0u; q < k4; q++) {
            let wv = w4(col * k4 + q);
            acc += vec4<f32>(dot(wv, x[x0 + q]), dot(wv, x[x1 + q]), dot(wv, x[x2 + q]), dot(wv, x[x3 + q]));
        }
        let o = r0 * p.out_stride + p.n_offset + col;
        out[o] = acc.x;
        if (r0 + 1u < p.m) { out[o + p.out_stride] = acc.y; }
        if (r0 + 2u < p.m) { out[o + 2u * p.out_stride] = acc.z; }
        if (r0 + 3u < p.m) { out[o + 3u * p.out_stride] = acc.w; }
    }
}
