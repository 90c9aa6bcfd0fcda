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
int main(int argc, char** argv) {
    if (argc != 6) return 2;
    const char* t = argv[1];
    u32 cols = (u32)atoi(argv[5]);
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
