//! WGSL kernel sources, one `.wgsl` file per kernel, shared by the native wgpu backend and the
//! browser build (both take the same strings), each typed by its parameter block (`params`).

// Test code builds fixtures from small numbers; the truncating-cast lint guards the rest.
#![cfg_attr(test, allow(clippy::cast_possible_truncation))]

use std::marker::PhantomData;

mod params;

pub use params::*;

/// A kernel: its file name (for errors and logs), its source and its entry points; `P` is its
/// uniform parameter block, so a dispatch of this kernel takes exactly that struct.
#[derive(Debug)]
pub struct Kernel<P: 'static = Untyped> {
    pub name: &'static str,
    pub source: &'static str,
    pub entry_points: &'static [&'static str],
    /// The fields of the WGSL `Params` this kernel binds, as `P` lays them out.
    pub params: &'static [ParamField],
    params_type: PhantomData<fn() -> P>,
}

/// A kernel whose parameter type is forgotten (`Kernel::erased`): for lists of every kernel.
#[derive(Debug, Clone, Copy)]
pub struct Untyped;

impl<P> Clone for Kernel<P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P> Copy for Kernel<P> {}

impl<P: KernelParams> Kernel<P> {
    const fn new(
        name: &'static str,
        source: &'static str,
        entry_points: &'static [&'static str],
    ) -> Self {
        Kernel {
            name,
            source,
            entry_points,
            params: P::FIELDS,
            params_type: PhantomData,
        }
    }
}

impl<P> Kernel<P> {
    /// The same kernel without its parameter type.
    pub const fn erased(&self) -> Kernel {
        Kernel {
            name: self.name,
            source: self.source,
            entry_points: self.entry_points,
            params: self.params,
            params_type: PhantomData,
        }
    }
}

/// A kernel whose source is a header (the weight storage: `weights_f32` or `weights_f16`)
/// followed by the body, so one body serves both storages.
macro_rules! kernel_with {
    ($header:literal, $name:literal, [$($entry:literal),+]) => {
        Kernel::new(
            concat!($name, "+", $header),
            concat!(
                include_str!(concat!("../wgsl/", $header, ".wgsl")),
                include_str!(concat!("../wgsl/", $name, ".wgsl"))
            ),
            &[$($entry),+],
        )
    };
}

macro_rules! kernel {
    ($name:literal, [$($entry:literal),+]) => {
        Kernel::new(
            $name,
            include_str!(concat!("../wgsl/", $name, ".wgsl")),
            &[$($entry),+],
        )
    };
}

pub const EMBEDDING: Kernel<EmbeddingParams> = kernel!("embedding", ["main"]);
pub const RMS_NORM: Kernel<RmsNormParams> = kernel!("rms_norm", ["main"]);
pub const MATMUL: Kernel<MatmulParams> = kernel!("matmul", ["main"]);
pub const ADD_ASSIGN: Kernel<AddAssignParams> = kernel!("add_assign", ["main"]);
pub const ADD_BIAS: Kernel<AddBiasParams> = kernel!("add_bias", ["main"]);
pub const GATED_ACT: Kernel<GatedActParams> = kernel!("gated_act", ["main"]);
pub const SCALE: Kernel<ScaleParams> = kernel!("scale", ["main"]);
pub const ROPE: Kernel<RopeParams> = kernel!("rope", ["main"]);
pub const WRITE_KV: Kernel<WriteKvParams> = kernel!("write_kv", ["main"]);
pub const PAGED_ATTENTION: Kernel<PagedAttentionParams> = kernel!("paged_attention", ["main"]);
pub const ATTENTION_REDUCE: Kernel<AttentionReduceParams> = kernel!("attention_reduce", ["main"]);
pub const GATHER_ROWS: Kernel<GatherRowsParams> = kernel!("gather_rows", ["main"]);
pub const ARGMAX: Kernel<ArgmaxParams> = kernel!("argmax", ["main"]);
pub const FILL: Kernel<FillParams> = kernel!("fill", ["main"]);
pub const COPY_BLOCKS: Kernel<CopyBlocksParams> = kernel!("copy_blocks", ["main"]);
pub const MATMUL_TILED_F32: Kernel<MatmulParams> =
    kernel_with!("weights_f32", "matmul_tiled", ["main"]);
pub const MATMUL_TILED_F16: Kernel<MatmulParams> =
    kernel_with!("weights_f16", "matmul_tiled", ["main"]);
pub const MATMUL_SMALL_F32: Kernel<MatmulParams> =
    kernel_with!("weights_f32", "matmul_small", ["main"]);
pub const MATMUL_SMALL_F16: Kernel<MatmulParams> =
    kernel_with!("weights_f16", "matmul_small", ["main"]);
pub const MATMUL_ROWS_F32: Kernel<MatmulParams> =
    kernel_with!("weights_f32", "matmul_rows", ["main"]);
pub const MATMUL_ROWS_F16: Kernel<MatmulParams> =
    kernel_with!("weights_f16", "matmul_rows", ["main"]);
pub const RMS_NORM_ROWS: Kernel<RmsNormParams> = kernel!("rms_norm_rows", ["main"]);
pub const EMBEDDING_ROWS_F32: Kernel<EmbeddingRowsParams> =
    kernel_with!("weights_f32", "embedding_rows", ["main"]);
pub const EMBEDDING_ROWS_F16: Kernel<EmbeddingRowsParams> =
    kernel_with!("weights_f16", "embedding_rows", ["main"]);
pub const MOE_ROUTE: Kernel<MoeRouteParams> = kernel!("moe_route", ["main"]);
pub const MOE_GROUP: Kernel<MoeGroupParams> = kernel!("moe_group", ["main"]);
pub const MOE_COMBINE: Kernel<MoeCombineParams> = kernel!("moe_combine", ["main"]);
pub const MOE_ADD_BIAS: Kernel<AddBiasParams> = kernel!("moe_add_bias", ["main"]);
pub const MOE_MATMUL_F32: Kernel<MoeMatmulParams> =
    kernel_with!("weights_f32", "moe_matmul", ["main"]);
pub const MOE_MATMUL_F16: Kernel<MoeMatmulParams> =
    kernel_with!("weights_f16", "moe_matmul", ["main"]);
/// Most experts the grouping kernel holds (its `MAX_EXPERTS`).
pub const MOE_MAX_EXPERTS: usize = 4096;
/// Rows of `x` the small-batch matmul takes at once (its `MAX_M`).
pub const MATMUL_SMALL_MAX_M: usize = 8;

/// Every kernel, for validation and pipeline warm-up.
pub const ALL: &[Kernel] = &[
    EMBEDDING.erased(),
    RMS_NORM.erased(),
    MATMUL.erased(),
    ADD_ASSIGN.erased(),
    ADD_BIAS.erased(),
    GATED_ACT.erased(),
    SCALE.erased(),
    ROPE.erased(),
    WRITE_KV.erased(),
    PAGED_ATTENTION.erased(),
    ATTENTION_REDUCE.erased(),
    GATHER_ROWS.erased(),
    ARGMAX.erased(),
    FILL.erased(),
    COPY_BLOCKS.erased(),
    MATMUL_TILED_F32.erased(),
    MATMUL_TILED_F16.erased(),
    MATMUL_SMALL_F32.erased(),
    MATMUL_SMALL_F16.erased(),
    MATMUL_ROWS_F32.erased(),
    MATMUL_ROWS_F16.erased(),
    RMS_NORM_ROWS.erased(),
    EMBEDDING_ROWS_F32.erased(),
    EMBEDDING_ROWS_F16.erased(),
    MOE_ROUTE.erased(),
    MOE_GROUP.erased(),
    MOE_COMBINE.erased(),
    MOE_ADD_BIAS.erased(),
    MOE_MATMUL_F32.erased(),
    MOE_MATMUL_F16.erased(),
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

    /// The WGSL struct of the kernel's uniform binding: (name, offset, kind) per member and
    /// its size.
    fn wgsl_params(k: &Kernel) -> (Vec<(String, usize, ScalarKind)>, usize) {
        let module = validate(k, WEBGPU_CORE);
        let uniforms: Vec<_> = module
            .global_variables
            .iter()
            .filter(|(_, g)| g.space == naga::AddressSpace::Uniform)
            .collect();
        assert_eq!(uniforms.len(), 1, "{}: one uniform binding", k.name);
        let naga::TypeInner::Struct { members, span } = &module.types[uniforms[0].1.ty].inner
        else {
            panic!("{}: the uniform is not a struct", k.name);
        };
        let fields = members
            .iter()
            .map(|m| {
                let kind = match module.types[m.ty].inner {
                    naga::TypeInner::Scalar(naga::Scalar { kind, width: 4 }) => match kind {
                        naga::ScalarKind::Uint => ScalarKind::U32,
                        naga::ScalarKind::Sint => ScalarKind::I32,
                        naga::ScalarKind::Float => ScalarKind::F32,
                        other => panic!("{}: member of kind {other:?}", k.name),
                    },
                    ref other => panic!("{}: member of type {other:?}", k.name),
                };
                (m.name.clone().unwrap_or_default(), m.offset as usize, kind)
            })
            .collect();
        (fields, *span as usize)
    }

    #[test]
    fn every_parameter_struct_matches_its_kernels_wgsl() {
        for k in ALL {
            let (wgsl, span) = wgsl_params(k);
            let rust: Vec<_> = k
                .params
                .iter()
                .map(|f| (f.name.to_string(), f.offset, f.kind))
                .collect();
            // Padding may be spelt differently on each side; its size is checked below.
            let named = |v: &[(String, usize, ScalarKind)]| -> Vec<_> {
                v.iter()
                    .filter(|f| !f.0.starts_with('_'))
                    .cloned()
                    .collect()
            };
            assert_eq!(named(&rust), named(&wgsl), "{}: Params fields", k.name);
            let last = k.params.last().expect("a parameter block has fields");
            assert_eq!(last.offset + 4, span, "{}: Params size", k.name);
            assert_eq!(
                span % 16,
                0,
                "{}: a uniform block is 16-byte aligned",
                k.name
            );
        }
    }

    #[test]
    fn the_parameter_check_sees_a_mismatch() {
        // The check above compares what it should: a kernel given another kernel's block fails.
        let wrong = Kernel::<ScaleParams>::new(RMS_NORM.name, RMS_NORM.source, &["main"]).erased();
        let (wgsl, _) = wgsl_params(&wrong);
        let rust: Vec<_> = wrong.params.iter().map(|f| f.name.to_string()).collect();
        let names: Vec<_> = wgsl.iter().map(|f| f.0.clone()).collect();
        assert_ne!(rust, names);
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
