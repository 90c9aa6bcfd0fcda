// Weight access for the matmul kernels, f32 storage: four consecutive weights of a row.
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;

fn w4(i: u32) -> vec4<f32> {
    return w[i];
}
