// In place, element-wise: x *= value (`softcap` 0), or x = value * tanh(x / value)
// (`softcap` 1: Gemma 2's final logit soft-capping).
struct Params { len: u32, row_stride: u32, softcap: u32, value: f32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.row_stride + gid.x;
    if (i < p.len) {
        if (p.softcap == 1u) {
            x[i] = p.value * tanh(clamp(x[i] / p.value, -15.0, 15.0));
        } else {
            x[i] = x[i] * p.value;
        }
    }
}
