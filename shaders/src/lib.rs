//! WGSL kernel sources, one `.wgsl` file per kernel, shared by the native wgpu backend and the
//! browser build (both take the same strings).

/// A kernel: its file name (for errors and logs), its source and its entry points.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pub name: &'static str,
    pub source: &'static str,
    pub entry_points: &'static [&'static str],
}

macro_rules! kernel {
    ($name:literal, [$($entry:literal),+]) => {
        Kernel {
            name: $name,
            source: include_str!(concat!("../wgsl/", $name, ".wgsl")),
            entry_points: &[$($entry),+],
        }
    };
}

pub const EMBEDDING: Kernel = kernel!("embedding", ["main"]);
pub const RMS_NORM: Kernel = kernel!("rms_norm", ["main"]);
pub const MATMUL: Kernel = kernel!("matmul", ["main"]);
pub const ADD_ASSIGN: Kernel = kernel!("add_assign", ["main"]);
pub const ADD_BIAS: Kernel = kernel!("add_bias", ["main"]);
pub const SILU_MUL: Kernel = kernel!("silu_mul", ["main"]);
pub const ROPE: Kernel = kernel!("rope", ["main"]);
pub const WRITE_KV: Kernel = kernel!("write_kv", ["main"]);
pub const PAGED_ATTENTION: Kernel = kernel!("paged_attention", ["main"]);
pub const ATTENTION_REDUCE: Kernel = kernel!("attention_reduce", ["main"]);
pub const GATHER_ROWS: Kernel = kernel!("gather_rows", ["main"]);
pub const ARGMAX: Kernel = kernel!("argmax", ["main"]);

/// Every kernel, for validation and pipeline warm-up.
pub const ALL: &[Kernel] = &[
    EMBEDDING,
    RMS_NORM,
    MATMUL,
    ADD_ASSIGN,
    ADD_BIAS,
    SILU_MUL,
    ROPE,
    WRITE_KV,
    PAGED_ATTENTION,
    ATTENTION_REDUCE,
    GATHER_ROWS,
    ARGMAX,
];

/// Keys per partition of the paged-attention kernel (its `PART` constant).
pub const ATTENTION_PARTITION: usize = 512;
/// Largest head dimension the attention kernel holds in workgroup memory.
pub const MAX_HEAD_DIM: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;
    use naga::valid::{Capabilities, ValidationFlags, Validator};

    fn validate(k: &Kernel, caps: Capabilities) -> naga::Module {
        let module = naga::front::wgsl::parse_str(k.source)
            .unwrap_or_else(|e| panic!("{}.wgsl: {}", k.name, e.emit_to_string(k.source)));
        Validator::new(ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}.wgsl: {}", k.name, e.emit_to_string(k.source)));
        module
    }

    #[test]
    fn every_kernel_parses_and_validates_with_and_without_optional_features() {
        for k in ALL {
            for caps in [Capabilities::empty(), Capabilities::all()] {
                let module = validate(k, caps);
                for entry in k.entry_points {
                    assert!(
                        module.entry_points.iter().any(|e| e.name == *entry),
                        "{}.wgsl has no entry point {entry}",
                        k.name
                    );
                }
            }
        }
    }

    #[test]
    fn every_kernel_stays_within_browser_binding_limits() {
        // WebGPU's default: 8 storage buffers per shader stage.
        for k in ALL {
            let module = validate(k, Capabilities::empty());
            let storage = module
                .global_variables
                .iter()
                .filter(|(_, g)| matches!(g.space, naga::AddressSpace::Storage { .. }))
                .count();
            assert!(
                storage <= 8,
                "{}.wgsl binds {storage} storage buffers",
                k.name
            );
        }
    }

    #[test]
    fn partition_constants_match_the_kernel() {
        let src = PAGED_ATTENTION.source;
        assert!(src.contains(&format!("const PART: u32 = {ATTENTION_PARTITION}u;")));
        assert!(src.contains(&format!("const MAX_HEAD_DIM: u32 = {MAX_HEAD_DIM}u;")));
    }
}
