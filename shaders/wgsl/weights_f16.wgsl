// Weight access for the matmul kernels, f16 storage packed two per u32: half the memory and
// bandwidth of f32, and core WGSL (`unpack2x16float`) so it needs no SHADER_F16 feature and
// runs in every browser.
@group(0) @binding(1) var<storage, read> w: array<vec2<u32>>;

fn w4(i: u32) -> vec4<f32> {
    let p = w[i];
    return vec4<f32>(unpack2x16float(p.x), unpack2x16float(p.y));
}
