//! Every kernel file compiles with NVRTC for the architectures we target (Ampere, Ada,
//! Hopper) and defines the kernels the backend loads. Needs only libnvrtc, no GPU: CI installs
//! it from PyPI (`nvidia-cuda-nvrtc-cu12`); where it is absent the test says so and passes.

use infer_cuda::kernels::{compile, nvrtc_present, SOURCES};

#[test]
fn every_kernel_compiles_with_nvrtc() {
    if !nvrtc_present() {
        eprintln!("SKIPPED: libnvrtc not found (set LD_LIBRARY_PATH to a CUDA 12 NVRTC)");
        return;
    }
    for arch in [(8, 0), (8, 9), (9, 0)] {
        for (file, src, kernels) in SOURCES {
            let ptx = compile(file, src, arch).unwrap_or_else(|e| panic!("{e}"));
            let text = ptx.to_src();
            for k in *kernels {
                assert!(
                    text.contains(&format!(".entry {k}(")),
                    "{file} for sm_{}{}: no kernel `{k}` in the PTX",
                    arch.0,
                    arch.1
                );
            }
        }
    }
}

#[test]
fn a_kernel_with_an_error_reports_nvrtcs_log() {
    if !nvrtc_present() {
        eprintln!("SKIPPED: libnvrtc not found");
        return;
    }
    let err = compile(
        "broken.cu",
        "extern \"C\" __global__ void f() { undefined_thing(); }",
        (8, 0),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("broken.cu") && err.contains("undefined_thing"),
        "{err}"
    );
}
