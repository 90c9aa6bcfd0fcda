//! The CPU backend's routed-MLP ops against the float64 reference, and its packed experts
//! (every GGUF quant type, kept as stored) against their dequantized values.

use infer_core::gguf::{GgmlType, GgufFile};
use infer_core::moe::{MoeRouting, MoeScoring};
use infer_core::{Backend, PackedTensor};
use infer_cpu::CpuBackend;
use infer_tests::conformance::{assert_close, check_moe_ops, cpu, host, moe_cases, random, up};
use infer_tests::fixtures_dir;
use rand::rngs::StdRng;
use rand::SeedableRng;

#[test]
fn cpu_moe_ops_match_the_float64_reference() {
    for (i, case) in moe_cases().iter().enumerate() {
        check_moe_ops(&cpu(), case, false, 100 + i as u64, 1e-5);
    }
}

#[test]
fn packed_experts_match_their_dequantized_values() {
    let g = GgufFile::open(&fixtures_dir().join("quants.gguf")).unwrap();
    let packed_cpu = CpuBackend::new();
    let reference = cpu();
    let mut rng = StdRng::seed_from_u64(7);
    // 3 experts of one 512-wide row each; 4 tokens, 2 experts each.
    let routing = MoeRouting {
        num_experts: 3,
        top_k: 2,
        scoring: MoeScoring::SoftmaxTopK { renormalize: true },
    };
    let logits = random(&mut rng, 4 * 3);
    let x = random(&mut rng, 4 * 512);
    for dtype in GgmlType::QUANTIZED {
        let name = dtype.name().to_lowercase();
        let info = &g.tensors[&name];
        let packed = PackedTensor {
            shape: vec![3, 1, 512],
            dtype,
            data: g.packed_bytes(info).unwrap(),
        };
        let experts = packed_cpu
            .upload_packed(&packed)
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: the cpu keeps experts packed"));
        assert!(
            packed_cpu.to_host(&experts).is_err(),
            "{name}: stays packed"
        );
        let dense = reference.upload_matrix(&packed.dequantize()).unwrap();
        let run = |b: &CpuBackend, w| {
            let r = b.moe_route(&up(b, &[4, 3], &logits), &routing).unwrap();
            host(b, &b.moe_matmul(&up(b, &[4, 512], &x), w, &r).unwrap())
        };
        // The integer path reads 8-bit activation planes (as the dense matmul does).
        assert_close(
            &name,
            &run(&packed_cpu, &experts),
            &run(&reference, &dense),
            2e-3,
        );
    }
}
