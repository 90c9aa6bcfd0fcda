//! Each kernel's uniform parameter block as a Rust struct laid out like the kernel's WGSL
//! `struct Params` (`#[repr(C)]`, every field 4 bytes, padded to 16-byte multiples). A kernel
//! constant carries its struct as a type parameter, so a dispatch cannot pass another kernel's
//! block, and a test compares every struct with the WGSL it is bound to (names, offsets,
//! scalar types and size), so the two cannot drift apart. Fields named `_...` are padding.

/// A scalar type a parameter field may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarKind {
    U32,
    I32,
    F32,
}

/// One field of a parameter block: its WGSL name, byte offset and scalar type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamField {
    pub name: &'static str,
    pub offset: usize,
    pub kind: ScalarKind,
}

/// A Rust type that a WGSL scalar field is written from.
pub trait Scalar {
    const KIND: ScalarKind;
}

impl Scalar for u32 {
    const KIND: ScalarKind = ScalarKind::U32;
}

impl Scalar for i32 {
    const KIND: ScalarKind = ScalarKind::I32;
}

impl Scalar for f32 {
    const KIND: ScalarKind = ScalarKind::F32;
}

/// A kernel's parameter block: plain old data with its field list.
pub trait KernelParams: bytemuck::Pod {
    const FIELDS: &'static [ParamField];
}

macro_rules! params {
    ($($(#[$meta:meta])* $name:ident { $($field:ident: $ty:ident),+ $(,)? })+) => {$(
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name {
            $(pub $field: $ty),+
        }

        impl KernelParams for $name {
            const FIELDS: &'static [ParamField] = &[$(ParamField {
                name: stringify!($field),
                offset: core::mem::offset_of!($name, $field),
                kind: <$ty as Scalar>::KIND,
            }),+];
        }
    )+};
}

params! {
    /// `embedding.wgsl`: `out[t] = table[ids[t]]`, one float per invocation.
    EmbeddingParams { hidden: u32, num_tokens: u32, row_stride: u32, _pad: u32 }
    /// `embedding_rows.wgsl`: the table's rows `row_begin..row_end` (one binding's part),
    /// four floats per invocation.
    EmbeddingRowsParams {
        hidden4: u32, num_tokens: u32, row_stride: u32, row_begin: u32, row_end: u32,
        _p0: u32, _p1: u32, _p2: u32,
    }
    /// `rms_norm.wgsl` and `rms_norm_rows.wgsl`.
    RmsNormParams { cols: u32, rows: u32, eps: f32, _pad: u32 }
    /// Every matmul kernel: `x [m, k] · w [n, k]ᵀ` into columns `n_offset..n_offset + n` of an
    /// output `out_stride` wide (one part of a split weight).
    MatmulParams { m: u32, n: u32, k: u32, n_offset: u32, out_stride: u32, _p0: u32, _p1: u32, _p2: u32 }
    /// `add_assign.wgsl`.
    AddAssignParams { len: u32, row_stride: u32, _pad0: u32, _pad1: u32 }
    /// `add_bias.wgsl` and `moe_add_bias.wgsl`.
    AddBiasParams { len: u32, cols: u32, row_stride: u32, _pad: u32 }
    /// `gated_act.wgsl`: `act` 0 SiLU, 1 GELU-tanh, 2 clamped SwiGLU (`alpha`, `limit`).
    GatedActParams {
        len: u32, row_stride: u32, act: u32, _pad: u32, alpha: f32, limit: f32, _p1: u32, _p2: u32,
    }
    /// `scale.wgsl`: `x *= value`, or `value · tanh(x / value)` when `softcap` is 1.
    ScaleParams { len: u32, row_stride: u32, softcap: u32, value: f32 }
    /// `rope.wgsl`.
    RopeParams {
        num_tokens: u32, heads: u32, head_dim: u32, adjacent: u32, rotary_dim: u32,
        _pad0: u32, _pad1: u32, _pad2: u32,
    }
    /// `write_kv.wgsl`.
    WriteKvParams { num_tokens: u32, row: u32, row_stride: u32, _pad: u32 }
    /// `paged_attention.wgsl` (pass 1): `window` 0 is none, `softcap` 0 is none.
    PagedAttentionParams {
        num_tokens: u32, heads: u32, kv_heads: u32, head_dim: u32, block_size: u32,
        max_blocks: u32, num_parts: u32, scale: f32, window: u32, softcap: f32,
        _pad0: u32, _pad1: u32,
    }
    /// `attention_reduce.wgsl` (pass 2).
    AttentionReduceParams {
        num_tokens: u32, heads: u32, head_dim: u32, num_parts: u32, has_sinks: u32,
        _p0: u32, _p1: u32, _p2: u32,
    }
    /// `gather_rows.wgsl`.
    GatherRowsParams { cols: u32, num_rows: u32, row_stride: u32, _pad: u32 }
    /// `argmax.wgsl`.
    ArgmaxParams { cols: u32, rows: u32, _pad0: u32, _pad1: u32 }
    /// `fill.wgsl`: `bits` is the f32 written, as bits.
    FillParams { len: u32, bits: u32, row_stride: u32, _pad: u32 }
    /// `copy_blocks.wgsl`.
    CopyBlocksParams { block_floats: u32, num_pairs: u32, row_stride: u32, _pad: u32 }
    /// `moe_route.wgsl`.
    MoeRouteParams { tokens: u32, experts: u32, top_k: u32, renormalize: u32 }
    /// `moe_group.wgsl`.
    MoeGroupParams { assignments: u32, experts: u32, _p0: u32, _p1: u32 }
    /// `moe_matmul.wgsl`: the part of the stacked experts holding rows `first..first + rows`,
    /// experts from `e0`.
    MoeMatmulParams {
        n: u32, k: u32, top_k: u32, per_token: u32, first: u32, rows: u32, tiles: u32, e0: u32,
    }
    /// `moe_combine.wgsl`.
    MoeCombineParams { len: u32, cols: u32, top_k: u32, row_stride: u32 }
}
