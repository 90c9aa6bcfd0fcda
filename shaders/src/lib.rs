//! WGSL kernel sources, one `.wgsl` file per kernel, shared by the native wgpu backend and the
//! browser build (both take the same strings).

/// A kernel: its file name (for errors and logs), its source and its entry points.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pub name: &'static str,
    pub source: &'static str,
    pub entry_points: &'static [&'static str],
}

/// A kernel whose source is a header (the weight storage: `weights_f32` or `weights_f16`)
/// followed by the body, so one body serves both storages.
macro_rules! kernel_with {
    ($header:literal, $name:literal, [$($entry:literal),+]) => {
        Kernel {
            name: concat!($name, "+", $header),
            source: concat!(
                include_str!(concat!("../wgsl/", $header, ".wgsl")),
                include_str!(concat!("../wgsl/", $name, ".wgsl"))
            ),
            entry_points: &[$($entry),+],
        }
    };
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
pub const GATED_ACT: Kernel = kernel!("gated_act", ["main"]);
pub const SCALE: Kernel = kernel!("scale", ["main"]);
pub const ROPE: Kernel = kernel!("rope", ["main"]);
pub const WRITE_KV: Kernel = kernel!("write_kv", ["main"]);
pub const PAGED_ATTENTION: Kernel = kernel!("paged_attention", ["main"]);
pub const ATTENTION_REDUCE: Kernel = kernel!("attention_reduce", ["main"]);
pub const GATHER_ROWS: Kernel = kernel!("gather_rows", ["main"]);
pub const ARGMAX: Kernel = kernel!("argmax", ["main"]);
pub const FILL: Kernel = kernel!("fill", ["main"]);
pub const COPY_BLOCKS: Kernel = kernel!("copy_blocks", ["main"]);
pub const MATMUL_TILED_F32: Kernel = kernel_with!("weights_f32", "matmul_tiled", ["main"]);
pub const MATMUL_TILED_F16: Kernel = kernel_with!("weights_f16", "matmul_tiled", ["main"]);
pub const MATMUL_SMALL_F32: Kernel = kernel_with!("weights_f32", "matmul_small", ["main"]);
pub const MATMUL_SMALL_F16: Kernel = kernel_with!("weights_f16", "matmul_small", ["main"]);
pub const MATMUL_ROWS_F32: Kernel = kernel_with!("weights_f32", "matmul_rows", ["main"]);
pub const MATMUL_ROWS_F16: Kernel = kernel_with!("weights_f16", "matmul_rows", ["main"]);
pub const RMS_NORM_ROWS: Kernel = kernel!("rms_norm_rows", ["main"]);
pub const EMBEDDING_ROWS_F32: Kernel = kernel_with!("weights_f32", "embedding_rows", ["main"]);
pub const EMBEDDING_ROWS_F16: Kernel = kernel_with!("weights_f16", "embedding_rows", ["main"]);
pub const MOE_ROUTE: Kernel = kernel!("moe_route", ["main"]);
pub const MOE_GROUP: Kernel = kernel!("moe_group", ["main"]);
pub const MOE_COMBINE: Kernel = kernel!("moe_combine", ["main"]);
pub const MOE_ADD_BIAS: Kernel = kernel!("moe_add_bias", ["main"]);
pub const MOE_MATMUL_F32: Kernel = kernel_with!("weights_f32", "moe_matmul", ["main"]);
pub const MOE_MATMUL_F16: Kernel = kernel_with!("weights_f16", "moe_matmul", ["main"]);
/// Most experts the grouping kernel holds (its `MAX_EXPERTS`).
pub const MOE_MAX_EXPERTS: usize = 4096;
/// Rows of `x` the small-batch matmul takes at once (its `MAX_M`).
pub const MATMUL_SMALL_MAX_M: usize = 8;

/// Every kernel, for validation and pipeline warm-up.
pub const ALL: &[Kernel] = &[
    EMBEDDING,
    RMS_NORM,
    MATMUL,
    ADD_ASSIGN,
    ADD_BIAS,
    GATED_ACT,
    SCALE,
    ROPE,
    WRITE_KV,
    PAGED_ATTENTION,
    ATTENTION_REDUCE,
    GATHER_ROWS,
    ARGMAX,
    FILL,
    COPY_BLOCKS,
    MATMUL_TILED_F32,
    MATMUL_TILED_F16,
    MATMUL_SMALL_F32,
    MATMUL_SMALL_F16,
    MATMUL_ROWS_F32,
    MATMUL_ROWS_F16,
    RMS_NORM_ROWS,
    EMBEDDING_ROWS_F32,
    EMBEDDING_ROWS_F16,
    MOE_ROUTE,
    MOE_GROUP,
    MOE_COMBINE,
    MOE_ADD_BIAS,
    MOE_MATMUL_F32,
    MOE_MATMUL_F16,
];

/// Keys per partition of the paged-attention kernel (its `PART` constant).
pub const ATTENTION_PARTITION: usize = 512;
/// Largest head dimension the attention kernel holds in workgroup memory.
pub const MAX_HEAD_DIM: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;
    use naga::valid::{Capabilities, ValidationFlags, Validator};

    /// What every WebGPU implementation offers: `unpack2x16float` is core WGSL, which naga
    /// models as a capability (wgpu grants it on every compliant adapter).
    const WEBGPU_CORE: Capabilities = Capabilities::SHADER_FLOAT16_IN_FLOAT32;

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
            for caps in [WEBGPU_CORE, Capabilities::all()] {
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
            let module = validate(k, WEBGPU_CORE);
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
        assert!(MOE_GROUP
            .source
            .contains(&format!("const MAX_EXPERTS: u32 = {MOE_MAX_EXPERTS}u;")));
        let src = MATMUL_SMALL_F32.source;
        assert!(src.contains(&format!("const MAX_M: u32 = {MATMUL_SMALL_MAX_M}u;")));
    }
}
