//! The quantized-weight kernels' arithmetic without a GPU: quant.cu's per-type dequantizers
//! (the code the matvec, the f16 dequantization and the embedding gather share) are compiled
//! for the host by the system C++ compiler, behind a few lines standing in for CUDA's
//! built-ins, and compared with core's dequantization (itself checked against ggml's) on
//! random blocks of every type; the matvec's lane-to-weight mapping is replayed the same way.
//! Skipped, saying so, where no C++ compiler is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use infer_core::dummy::{random_blocks, RANDOM_BLOCK_TYPES};
use infer_core::gguf::GgmlType;
use infer_cuda::kernels::SOURCES;

/// CUDA's qualifiers and vector types, and f16 bits to f32 by hand (no `_Float16` needed).
const SHIM: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cmath>
#define __device__
#define __forceinline__ inline
typedef unsigned int u32;
typedef unsigned short f16;
struct uint4 { u32 x, y, z, w; };
struct uint2 { u32 x, y; };
static float f16_to_f32(f16 h) {
    u32 sign = (u32)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, bits;
    if (exp == 0) {
        float v = (float)man * (1.0f / 16777216.0f);  // subnormal: man * 2^-24
        return sign ? -v : v;
    }
    bits = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static int __dp4a(int a, int b, int c) {
    for (int j = 0; j < 4; ++j) c += (int)(signed char)(a >> (8 * j)) * (int)(signed char)(b >> (8 * j));
    return c;
}
"#;

/// `dequant TYPE IN OUT MAPPED COLS`: the blocks in IN dequantized unit by unit into OUT, and
/// piece by piece in the order the matvec's lanes take them (rows of COLS) into MAPPED.
const MAIN: &str = r#"
template <class T> void run(const char* in, const char* out, const char* mapped, u32 cols) {
    FILE* f = fopen(in, "rb");
    std::vector<unsigned char> raw(1 << 22);
    size_t n = fread(raw.data(), 1, raw.size(), f);
    fclose(f);
    // A 16-aligned copy, as device allocations are.
    unsigned char* b = (unsigned char*)aligned_alloc(16, (n + 15) / 16 * 16);
    memcpy(b, raw.data(), n);
    size_t blocks = n / T::BYTES, row_bytes = cols / T::PER_BLOCK * T::BYTES;
    std::vector<float> y(blocks * T::PER_BLOCK), z(y.size());
    for (size_t i = 0; i < blocks; ++i)
        for (u32 u = 0; u < T::UNITS; ++u) unit<T>(b + i * T::BYTES, u, y.data() + i * T::PER_BLOCK + 32 * u);
    // The matvec: lane l takes weights k0 = 8l, 8l + 256, ... of each row, as piece (k0 / 8) % 4
    // of unit k0 / 32.
    for (size_t r = 0; r < n / row_bytes; ++r)
        for (u32 lane = 0; lane < 32; ++lane)
            for (u32 k0 = 8 * lane; k0 < cols; k0 += 256) {
                u32 g = k0 >> 5;
                T::piece(b + r * row_bytes + (size_t)(g / T::UNITS) * T::BYTES, g % T::UNITS, (k0 >> 3) & 3,
                         z.data() + r * cols + k0);
            }
    f = fopen(out, "wb");
    fwrite(y.data(), 4, y.size(), f);
    fclose(f);
    f = fopen(mapped, "wb");
    fwrite(z.data(), 4, z.size(), f);
    fclose(f);
    free(b);
}
// The integer matvec's arithmetic: x quantized to q8_1 runs, each row's units unpacked to
// ints and dotted (y_int), against the same codes times the float dequantization (y_ref);
// writes y_int, y_ref per row, then x as its codes give it back.
template <class T, class I> void dot(const char* in, const char* xin, const char* out, u32 cols) {
    std::vector<unsigned char> raw(1 << 22);
    FILE* f = fopen(in, "rb");
    size_t n = fread(raw.data(), 1, raw.size(), f);
    fclose(f);
    unsigned char* b = (unsigned char*)aligned_alloc(16, (n + 15) / 16 * 16);
    memcpy(b, raw.data(), n);
    std::vector<float> x(cols);
    f = fopen(xin, "rb");
    if (fread(x.data(), 4, cols, f) != cols) exit(4);
    fclose(f);
    u32 units = cols / 32;
    // 16-aligned codes, as the device's buffers.
    int* q = (int*)aligned_alloc(16, units * 32);
    std::vector<float> d(units), s(units);
    for (u32 g = 0; g < units; ++g) quantize_run_q8_1(x.data() + 32 * g, q + 8 * g, &d[g], &s[g]);
    size_t row_bytes = cols / T::PER_BLOCK * T::BYTES, rows = n / row_bytes;
    std::vector<float> res(2 * rows + cols);
    auto code = [&](u32 l) { return (int)(signed char)(q[l / 4] >> (8 * (l % 4))); };
    for (size_t r = 0; r < rows; ++r) {
        float yi = 0.0f, yr = 0.0f;
        for (u32 g = 0; g < units; ++g) {
            const unsigned char* blk = b + r * row_bytes + (size_t)(g / T::UNITS) * T::BYTES;
            int w[8];
            float d0, d1, mw, wf[32];
            I::ints(blk, g % T::UNITS, w, &d0, &d1, &mw);
            yi += unit_dot(w, d0, d1, mw, q + 8 * g, d[g], s[g]);
            unit<T>(blk, g % T::UNITS, wf);
            for (u32 l = 0; l < 32; ++l) yr += wf[l] * d[g] * (float)code(32 * g + l);
        }
        res[2 * r] = yi;
        res[2 * r + 1] = yr;
    }
    for (u32 l = 0; l < cols; ++l) res[2 * rows + l] = d[l / 32] * (float)code(l);
    f = fopen(out, "wb");
    fwrite(res.data(), 4, res.size(), f);
    fclose(f);
    free(b);
    free(q);
}
int main(int argc, char** argv) {
    if (argc != 6) return 2;
    const char* t = argv[1];
    u32 cols = (u32)atoi(argv[5]);
    if (!strncmp(t, "dot:", 4)) {
        t += 4;
#define DOT(NAME, T, I) if (!strcmp(t, NAME)) { dot<T, I>(argv[2], argv[3], argv[4], cols); return 0; }
        DOT("q8_0", TQ8_0, IQ8_0) DOT("q4_0", TQ4_0, IQ4_0) DOT("q4_1", TQ4_1, IQ4_1)
        DOT("q4_k", TQ4_K, IQ4_K) DOT("q5_k", TQ5_K, IQ5_K) DOT("q6_k", TQ6_K, IQ6_K)
        return 3;
    }
#define TYPE(NAME, T) if (!strcmp(t, NAME)) { run<T>(argv[2], argv[3], argv[4], cols); return 0; }
    TYPE("f16", TF16) TYPE("q8_0", TQ8_0) TYPE("q4_0", TQ4_0) TYPE("q4_1", TQ4_1)
    TYPE("q4_k", TQ4_K) TYPE("q5_k", TQ5_K) TYPE("q6_k", TQ6_K)
    return 3;
}
"#;

fn compiler() -> Option<&'static str> {
    ["c++", "g++", "clang++"].into_iter().find(|cc| {
        Command::new(cc)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn build(cc: &str, dir: &Path) -> PathBuf {
    let (_, source, _) = SOURCES
        .iter()
        .find(|(file, _, _)| *file == "quant.cu")
        .expect("quant.cu");
    // The type definitions and `unit`; the kernels after them need a GPU.
    let end = source
        .find("template <class T>\n__device__ __forceinline__ const u8* unit_block")
        .expect("quant.cu's unit_block marks the end of the dequantizers");
    let program = dir.join("dequant.cpp");
    std::fs::write(&program, format!("{SHIM}{}{MAIN}", &source[..end])).unwrap();
    let exe = dir.join("dequant");
    let out = Command::new(cc)
        .args(["-std=c++17", "-O1", "-o"])
        .arg(&exe)
        .arg(&program)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc} could not compile quant.cu's dequantizers:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn floats(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn quant_kernels_dequantize_like_core() {
    let Some(cc) = compiler() else {
        eprintln!("SKIPPED: no C++ compiler (c++, g++, clang++) on this machine");
        return;
    };
    let dir = std::env::temp_dir().join(format!("infer-host-dequant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = build(cc, &dir);
    let (rows, cols) = (3, 1280);
    let mut cases: Vec<(String, Vec<u8>, Vec<f32>)> = Vec::new();
    for (i, dtype) in RANDOM_BLOCK_TYPES.into_iter().enumerate() {
        let data = random_blocks(dtype, rows, cols, 7 + i as u64).unwrap();
        let mut want = vec![0f32; rows * cols];
        dtype.dequantize(&data, &mut want);
        cases.push((dtype.name().to_lowercase(), data, want));
    }
    // f16 rows: random finite halves.
    let halves: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 97.0)
        .collect();
    let bits: Vec<u8> = halves
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let mut want = vec![0f32; rows * cols];
    GgmlType::F16.dequantize(&bits, &mut want);
    cases.push(("f16".into(), bits, want));

    for (name, data, want) in cases {
        let (input, out, mapped) = (
            dir.join(format!("{name}.in")),
            dir.join(format!("{name}.out")),
            dir.join(format!("{name}.mapped")),
        );
        std::fs::write(&input, &data).unwrap();
        let status = Command::new(&exe)
            .arg(&name)
            .args([&input, &out, &mapped])
            .arg(cols.to_string())
            .status()
            .unwrap();
        assert!(
            status.success(),
            "{name}: the host build exited with {status}"
        );
        let scale = want.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
        for (what, got) in [("unit", floats(&out)), ("matvec pieces", floats(&mapped))] {
            assert_eq!(got.len(), want.len(), "{name} {what}: length");
            let worst = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (g - w).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 1e-6 * scale,
                "{name} {what}: max |diff| {worst} (values up to {scale})"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The decode matvec's integer path on the host: quantize_q8_1's runs reproduce x within half
/// a code step, and every type's unpacked ints dotted by `__dp4a` (emulated) equal the float
/// dequantization times the same codes; that in turn is the f32 product within the
/// activations' 8-bit rounding.
#[test]
fn integer_matvec_matches_the_dequantized_product() {
    let Some(cc) = compiler() else {
        eprintln!("SKIPPED: no C++ compiler (c++, g++, clang++) on this machine");
        return;
    };
    let dir = std::env::temp_dir().join(format!("infer-host-dot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = build(cc, &dir);
    let (rows, cols) = (4, 1536);
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 7919 % 4001) as f32 - 2000.0) / 1000.0 * if i % 97 == 0 { 6.0 } else { 1.0 })
        .collect();
    let xin = dir.join("x.in");
    std::fs::write(
        &xin,
        x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
    for (i, dtype) in RANDOM_BLOCK_TYPES.into_iter().enumerate() {
        let name = dtype.name().to_lowercase();
        let data = random_blocks(dtype, rows, cols, 70 + i as u64).unwrap();
        let mut w = vec![0f32; rows * cols];
        dtype.dequantize(&data, &mut w);
        let (input, out) = (
            dir.join(format!("{name}.in")),
            dir.join(format!("{name}.dot")),
        );
        std::fs::write(&input, &data).unwrap();
        let status = Command::new(&exe)
            .arg(format!("dot:{name}"))
            .args([&input, &xin, &out])
            .arg(cols.to_string())
            .status()
            .unwrap();
        assert!(
            status.success(),
            "{name}: the host build exited with {status}"
        );
        let res = floats(&out);
        assert_eq!(res.len(), 2 * rows + cols, "{name}: output length");
        let x_codes = &res[2 * rows..];
        for (run, (got, want)) in x_codes.chunks(32).zip(x.chunks(32)).enumerate() {
            let step = want.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            let worst = got
                .iter()
                .zip(want)
                .map(|(g, w)| (g - w).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 0.5001 * step + 1e-7,
                "{name}: run {run} off by {worst} (step {step})"
            );
        }
        for r in 0..rows {
            let (y_int, y_ref) = (res[2 * r], res[2 * r + 1]);
            let exact: f32 = w[r * cols..(r + 1) * cols]
                .iter()
                .zip(&x)
                .map(|(a, b)| a * b)
                .sum();
            let scale: f32 = w[r * cols..(r + 1) * cols]
                .iter()
                .zip(&x)
                .map(|(a, b)| (a * b).abs())
                .sum();
            assert!(
                (y_int - y_ref).abs() <= 1e-4 * scale,
                "{name} row {r}: integer {y_int} vs float {y_ref} (Σ|wx| {scale})"
            );
            assert!(
                (y_ref - exact).abs() <= 1e-2 * scale,
                "{name} row {r}: on q8_1 codes {y_ref} vs f32 {exact} (Σ|wx| {scale})"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
