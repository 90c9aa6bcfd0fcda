// out[m, n_offset + n] = x[m, k] · w[n, k]ᵀ (a linear layer), scalar loads for any k (the
// vec4 kernels need k % 4 == 0): 16×16 output tiles, K walked in 16-wide tiles staged in
// workgroup memory.
struct Params { m: u32, n: u32, k: u32, n_offset: u32, out_stride: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const T: u32 = 16u;
var<workgroup> xs: array<array<f32, T>, T>;
var<workgroup> ws: array<array<f32, T>, T>;

@compute @workgroup_size(T, T)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.y * T + lid.y;
    let col = wid.x * T + lid.x;
    // Thread (lid.x, lid.y) stages x[wid.y*T + lid.y, k0 + lid.x] and w[wid.x*T + lid.y, k0 + lid.x].
    let w_row = wid.x * T + lid.y;
    var acc = 0.0;
    for (var k0 = 0u; k0 < p.k; k0 += T) {
        let kk = k0 + lid.x;
        var xv = 0.0;
        if (row < p.m && kk < p.k) {
            xv = x[row * p.k + kk];
        }
        var wv = 0.0;
        if (w_row < p.n && kk < p.k) {
            wv = w[w_row * p.k + kk];
        }
        xs[lid.y][lid.x] = xv;
        ws[lid.y][lid.x] = wv;
        workgroupBarrier();
        for (var j = 0u; j < T; j++) {
            acc += xs[lid.y][j] * ws[lid.x][j];
        }
        workgroupBarrier();
    }
    if (row < p.m && col < p.n) {
        out[row * p.out_stride + p.n_offset + col] = acc;
    }
}
