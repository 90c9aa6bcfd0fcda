// out[m, n_offset + n] = x[m, k] · w[n, k]ᵀ for decode-sized m (≤ 8): the weights are the
// traffic, so each weight row is read once for all m rows. 8 output columns per workgroup,
// 32 invocations per column walking K as vec4, then one tree reduction for all rows at once.
// Needs k % 4 == 0. `w4` (the weight storage: f32 or packed f16) comes from a header.
struct Params { m: u32, n: u32, k: u32, n_offset: u32, out_stride: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const MAX_M: u32 = 8u;
const LANES: u32 = 32u;
const COLS: u32 = 8u;
var<workgroup> red: array<f32, 2048>; // [MAX_M][256]

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let col = (wid.x + wid.y * 65535u) * COLS + t / LANES;
    let lane = t % LANES;
    let k4 = p.k / 4u;
    var acc: array<f32, MAX_M>;
    if (col < p.n) {
        for (var q = lane; q < k4; q += LANES) {
            let wv = w4(col * k4 + q);
            for (var r = 0u; r < p.m; r++) {
                acc[r] += dot(wv, x[r * k4 + q]);
            }
        }
    }
    for (var r = 0u; r < MAX_M; r++) {
        red[r * 256u + t] = acc[r];
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s /= 2u) {
        if (lane < s) {
            for (var r = 0u; r < p.m; r++) {
                red[r * 256u + t] += red[r * 256u + t + s];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && col < p.n) {
        for (var r = 0u; r < p.m; r++) {
            out[r * p.out_stride + p.n_offset + col] = red[r * 256u + t];
        }
    }
}
