// out[m, n_offset + n] = x[m, k] · w[n, k]ᵀ for prefill-sized m: 64×64 output tiles, 256
// invocations each computing a 4×4 block, K staged 16 at a time in workgroup memory as vec4.
// Needs k % 4 == 0. `w4` (the weight storage: f32 or packed f16) comes from a header.
struct Params { m: u32, n: u32, k: u32, n_offset: u32, out_stride: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const TILE: u32 = 64u;
// vec4s per row of a K step (16 values).
const KQ: u32 = 4u;
var<workgroup> xs: array<vec4<f32>, 256>;
var<workgroup> ws: array<vec4<f32>, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    let k4 = p.k / 4u;
    // Staging: invocation t loads row t / KQ, vec4 t % KQ of both tiles.
    let sr = t / KQ;
    let sq = t % KQ;
    // Compute: rows tr*4.., columns tc*4...
    let tr = t / 16u;
    let tc = t % 16u;
    var acc: array<vec4<f32>, 4>;
    for (var kb = 0u; kb < k4; kb += KQ) {
        let kq = kb + sq;
        var xv = vec4<f32>(0.0);
        if (row0 + sr < p.m && kq < k4) {
            xv = x[(row0 + sr) * k4 + kq];
        }
        var wv = vec4<f32>(0.0);
        if (col0 + sr < p.n && kq < k4) {
            wv = w4((col0 + sr) * k4 + kq);
        }
        xs[t] = xv;
        ws[t] = wv;
        workgroupBarrier();
        for (var q = 0u; q < KQ; q++) {
            let b0 = ws[(tc * 4u) * KQ + q];
            let b1 = ws[(tc * 4u + 1u) * KQ + q];
            let b2 = ws[(tc * 4u + 2u) * KQ + q];
            let b3 = ws[(tc * 4u + 3u) * KQ + q];
            for (var i = 0u; i < 4u; i++) {
                let a = xs[(tr * 4u + i) * KQ + q];
                acc[i] += vec4<f32>(dot(a, b0), dot(a, b1), dot(a, b2), dot(a, b3));
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + tr * 4u + i;
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + tc * 4u + j;
            if (r < p.m && c < p.n) {
                out[r * p.out_stride + p.n_offset + c] = acc[i][j];
            }
        }
    }
}
