//! Dequantization of every GGUF quant type we read against the `gguf` package's numpy code, on
//! random blocks stored with their expected values by scripts/quant_fixture.py.

use infer_core::gguf::{GgmlType, GgufFile};
use infer_tests::{fixtures_dir, max_abs_diff};

#[test]
fn every_quant_type_dequantizes_like_ggml() {
    let g = GgufFile::open(&fixtures_dir().join("quants.gguf")).unwrap();
    for dtype in GgmlType::QUANTIZED {
        let name = dtype.name().to_lowercase();
        let info = &g.tensors[&name];
        assert_eq!(info.dtype, dtype);
        let mut got = vec![0f32; info.shape.iter().product()];
        dtype.dequantize(g.tensor_bytes(info).unwrap(), &mut got);
        let expected_info = &g.tensors[&format!("{name}.expected")];
        let mut want = vec![0f32; got.len()];
        GgmlType::F32.dequantize(g.tensor_bytes(expected_info).unwrap(), &mut want);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = max_abs_diff(&got, &want);
        assert!(
            diff <= 1e-6 * scale,
            "{name}: max |diff| {diff} (values up to {scale})"
        );
    }
}

#[test]
fn packed_weights_are_views_of_the_mapped_file() {
    let g = GgufFile::open(&fixtures_dir().join("quants.gguf")).unwrap();
    for dtype in GgmlType::QUANTIZED {
        let info = &g.tensors[&dtype.name().to_lowercase()];
        let bytes = g.packed_bytes(info).unwrap();
        // No copy: the CPU computes on the page cache, so resident memory stays the file's.
        assert!(bytes.is_mapped(), "{}", dtype.name());
        assert_eq!(&bytes[..], g.tensor_bytes(info).unwrap());
        let clone = bytes.clone();
        assert_eq!(clone.as_ptr(), bytes.as_ptr(), "clones share the view");
    }
}

/// The packed-matrix conformance check (which the GPU backends run) on the CPU's packed
/// kernels: every type `random_blocks` makes. The CPU quantizes activations to 8 bits for
/// its integer dot products, hence the looser tolerance.
#[test]
fn cpu_packed_matmul_passes_the_conformance_check() {
    use infer_core::dummy::RANDOM_BLOCK_TYPES;
    use infer_tests::conformance::check_packed_matmul;
    let cpu = infer_cpu::CpuBackend::new();
    for (i, dtype) in RANDOM_BLOCK_TYPES.into_iter().enumerate() {
        check_packed_matmul(&cpu, dtype, &[1, 3, 9], 37, 512, i as u64, |_| 2e-2);
    }
}
