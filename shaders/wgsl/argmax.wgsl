// Greedy sampling on the device: the index of each row's largest value (lowest index on ties),
// so greedy decoding reads back one id per sequence instead of a logits row.
struct Params { cols: u32, rows: u32, _pad0: u32, _pad1: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

const WG: u32 = 256u;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    // Uniform per workgroup, so the early return keeps the barriers uniform.
    let row = wid.x + wid.y * 65535u;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var v = -3.4e38;
    var idx = 0xffffffffu;
    for (var c = lid.x; c < p.cols; c += WG) {
        let x_c = x[base + c];
        if (x_c > v) {
            v = x_c;
            idx = c;
        }
    }
    best_v[lid.x] = v;
    best_i[lid.x] = idx;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s /= 2u) {
        if (lid.x < s) {
            let ov = best_v[lid.x + s];
            let oi = best_i[lid.x + s];
            if (ov > best_v[lid.x] || (ov == best_v[lid.x] && oi < best_i[lid.x])) {
                best_v[lid.x] = ov;
                best_i[lid.x] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid.x == 0u) {
        out[row] = select(best_i[0], 0u, best_i[0] == 0xffffffffu);
    }
}
