// The expert-grouped matmul: out[a, col] = x[row(a)] · w[e·n + col] for every assignment a
// routed to expert e, where row(a) is a's token (x per token) or a itself (x per assignment).
// A workgroup takes 8 output columns of one expert and walks that expert's group 8
// assignments at a time, so each weight row is read once per 8 tokens routed to it and an
// expert with no tokens costs one load. 32 invocations per column walk K as vec4, then one
// tree reduction (as matmul_small). Needs k % 4 == 0. `w4` comes from the weights header;
// this dispatch sees the stacked matrix's rows first..first + rows (one part of it).
struct Params { n: u32, k: u32, top_k: u32, per_token: u32, first: u32, rows: u32, tiles: u32, e0: u32 }

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;
@group(0) @binding(4) var<storage, read> order: array<u32>;
@group(0) @binding(5) var<uniform> p: Params;

const MAX_M: u32 = 8u;
const LANES: u32 = 32u;
const COLS: u32 = 8u;
var<workgroup> red: array<f32, 2048>; // [MAX_M][256]
var<workgroup> span: vec2<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let g = wid.x + wid.y * 65535u;
    let e = p.e0 + g / p.tiles;
    let col = (g % p.tiles) * COLS + t / LANES;
    let lane = t % LANES;
    if (t == 0u) {
        span = vec2<u32>(offsets[e], offsets[e + 1u]);
    }
    let group = workgroupUniformLoad(&span);
    let wrow = e * p.n + col;
    let valid = col < p.n && wrow >= p.first && wrow < p.first + p.rows;
    let k4 = p.k / 4u;
    let base = (wrow - min(wrow, p.first)) * k4;
    var acc: array<f32, MAX_M>;
    for (var c = group.x; c < group.y; c += MAX_M) {
        let m = min(MAX_M, group.y - c);
        // Zeroed explicitly each chunk: Chromium's compiler kept the previous chunk's sums in
        // an array declared inside the loop (its zero-initialization ran once).
        for (var r = 0u; r < MAX_M; r++) {
            acc[r] = 0.0;
        }
        if (valid) {
            for (var q = lane; q < k4; q += LANES) {
                let wv = w4(base + q);
                for (var r = 0u; r < m; r++) {
                    let a = order[c + r];
                    let xr = select(a, a / p.top_k, p.per_token != 0u);
                    acc[r] += dot(wv, x[xr * k4 + q]);
                }
            }
        }
        for (var r = 0u; r < MAX_M; r++) {
            red[r * 256u + t] = acc[r];
        }
        workgroupBarrier();
        for (var s = LANES / 2u; s > 0u; s /= 2u) {
            if (lane < s) {
                for (var r = 0u; r < m; r++) {
                    red[r * 256u + t] += red[r * 256u + t + s];
                }
            }
            workgroupBarrier();
        }
        if (lane == 0u && valid) {
            for (var r = 0u; r < m; r++) {
                out[order[c + r] * p.n + col] = red[r * 256u + t];
            }
        }
        workgroupBarrier();
    }
}
