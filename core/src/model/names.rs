//! Where each canonical weight lives in a file: its tensor name in HF checkpoints and in GGUF
//! (as llama.cpp's converter names it), or a row range of a fused projection (Phi-3's
//! `qkv_proj` and `gate_up_proj`). A family lists only the names that differ from Llama's.

use std::ops::Range;

use crate::config::ModelConfig;
use crate::host_tensor::HostTensor;
use crate::model::weight_name::{LayerWeight, WeightName};

/// The two file formats' naming schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// HF safetensors (`model.layers.{i}.self_attn.q_proj.weight`).
    Hf,
    /// GGUF (`blk.{i}.attn_q.weight`).
    Gguf,
}

/// How a stored tensor differs from the canonical layout (gpt-oss's HF experts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Stored `[experts, in, out]`: the last two dimensions swap.
    Transposed,
    /// The gate (offset 0) or up (offset 1) rows of a fused projection stored `[experts, in,
    /// 2·out]` with gate and up interleaved: transposed, then every other row.
    TransposedInterleaved(usize),
    /// Every other element of the last dimension, from the offset (the fused bias
    /// `[experts, 2·out]`).
    Interleaved(usize),
}

impl Layout {
    /// The canonical tensor from the stored one.
    pub fn apply(self, t: HostTensor) -> Option<HostTensor> {
        let (lead, a, b) = match t.shape.as_slice() {
            [e, a, b] => (*e, *a, *b),
            [a, b] => (1, *a, *b),
            _ => return None,
        };
        let transposed = |t: &HostTensor| {
            let mut out = vec![0f32; t.data.len()];
            for e in 0..lead {
                for i in 0..a {
                    for j in 0..b {
                        out[(e * b + j) * a + i] = t.data[(e * a + i) * b + j];
                    }
                }
            }
            out
        };
        let every_other = |data: &[f32], rows: usize, cols: usize, off: usize| {
            // Rows `off, off + 2, …` of each `[rows, cols]` matrix.
            (0..lead)
                .flat_map(|e| (off..rows).step_by(2).map(move |r| (e * rows + r) * cols))
                .flat_map(|at| data[at..at + cols].iter().copied())
                .collect::<Vec<f32>>()
        };
        let shape = |dims: [usize; 2]| {
            if t.shape.len() == 3 {
                vec![lead, dims[0], dims[1]]
            } else {
                dims.to_vec()
            }
        };
        Some(match self {
            Layout::Transposed => HostTensor::new(shape([b, a]), transposed(&t)),
            Layout::TransposedInterleaved(off) if b.is_multiple_of(2) => {
                HostTensor::new(shape([b / 2, a]), every_other(&transposed(&t), b, a, off))
            }
            Layout::Interleaved(off) if b.is_multiple_of(2) => {
                // Columns of a 2-D `[a, b]` tensor: rows of its transpose.
                let data: Vec<f32> = (0..a)
                    .flat_map(|i| (off..b).step_by(2).map(move |j| i * b + j))
                    .map(|at| t.data[at])
                    .collect();
                HostTensor::new(shape([a, b / 2]), data)
            }
            _ => return None,
        })
    }
}

/// A canonical weight's place: a whole tensor, rows of one, or one tensor per expert
/// stacked (HF checkpoints keep `experts.{e}.…` apart; GGUF stores them as one 3-D tensor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLoc {
    pub name: String,
    pub rows: Option<Range<usize>>,
    /// `Some(n)`: `name` holds `{e}`, and the weight is experts `0..n` stacked.
    pub stacked: Option<usize>,
    /// The stored layout, where it is not the canonical one.
    pub layout: Option<Layout>,
}

impl TensorLoc {
    /// Expert `e`'s tensor name, for a stacked weight.
    pub fn expert_name(&self, e: usize) -> String {
        self.name.replace("{e}", &e.to_string())
    }
}

/// A family's tensor names.
pub struct TensorNames {
    /// Per-layer HF names (after `model.layers.{i}.`) that differ from Llama's.
    pub hf: &'static [(LayerWeight, &'static str)],
    /// Per-layer GGUF names (after `blk.{i}.`) that differ from llama.cpp's Llama names.
    pub gguf: &'static [(LayerWeight, &'static str)],
    /// Q, K and V are row ranges of one fused projection, and gate and up of another.
    pub fused: bool,
    /// HF tensors stored in another layout (gpt-oss's experts).
    pub hf_layouts: &'static [(LayerWeight, Layout)],
}

impl TensorNames {
    /// Llama's names: most families need nothing else.
    pub const LLAMA: TensorNames = TensorNames {
        hf: &[],
        gguf: &[],
        fused: false,
        hf_layouts: &[],
    };

    fn layer_name(&self, format: Format, lw: LayerWeight) -> &'static str {
        let overrides = match format {
            Format::Hf => self.hf,
            Format::Gguf => self.gguf,
        };
        if let Some((_, name)) = overrides.iter().find(|(w, _)| *w == lw) {
            return name;
        }
        use LayerWeight::*;
        match format {
            Format::Hf => match lw {
                AttnNorm => "input_layernorm.weight",
                Q => "self_attn.q_proj.weight",
                K => "self_attn.k_proj.weight",
                V => "self_attn.v_proj.weight",
                QBias => "self_attn.q_proj.bias",
                KBias => "self_attn.k_proj.bias",
                VBias => "self_attn.v_proj.bias",
                QNorm => "self_attn.q_norm.weight",
                KNorm => "self_attn.k_norm.weight",
                O => "self_attn.o_proj.weight",
                PostAttnNorm => "post_attention_layernorm.weight",
                FfnNorm => "post_attention_layernorm.weight",
                Gate => "mlp.gate_proj.weight",
                Up => "mlp.up_proj.weight",
                Down => "mlp.down_proj.weight",
                PostFfnNorm => "post_feedforward_layernorm.weight",
                Router => "mlp.gate.weight",
                RouterBias => "mlp.gate.bias",
                OBias => "self_attn.o_proj.bias",
                Sinks => "self_attn.sinks",
                ExpGateBias => "mlp.experts.{e}.gate_proj.bias",
                ExpUpBias => "mlp.experts.{e}.up_proj.bias",
                ExpDownBias => "mlp.experts.{e}.down_proj.bias",
                ExpGate => "mlp.experts.{e}.gate_proj.weight",
                ExpUp => "mlp.experts.{e}.up_proj.weight",
                ExpDown => "mlp.experts.{e}.down_proj.weight",
            },
            Format::Gguf => match lw {
                AttnNorm => "attn_norm.weight",
                Q => "attn_q.weight",
                K => "attn_k.weight",
                V => "attn_v.weight",
                QBias => "attn_q.bias",
                KBias => "attn_k.bias",
                VBias => "attn_v.bias",
                QNorm => "attn_q_norm.weight",
                KNorm => "attn_k_norm.weight",
                O => "attn_output.weight",
                PostAttnNorm => "post_attention_norm.weight",
                FfnNorm => "ffn_norm.weight",
                Gate => "ffn_gate.weight",
                Up => "ffn_up.weight",
                Down => "ffn_down.weight",
                PostFfnNorm => "post_ffw_norm.weight",
                Router => "ffn_gate_inp.weight",
                RouterBias => "ffn_gate_inp.bias",
                OBias => "attn_output.bias",
                Sinks => "attn_sinks.weight",
                ExpGateBias => "ffn_gate_exps.bias",
                ExpUpBias => "ffn_up_exps.bias",
                ExpDownBias => "ffn_down_exps.bias",
                ExpGate => "ffn_gate_exps.weight",
                ExpUp => "ffn_up_exps.weight",
                ExpDown => "ffn_down_exps.weight",
            },
        }
    }

    /// Where `w` lives in a file of `format` for a model of config `c`.
    pub fn locate(&self, format: Format, c: &ModelConfig, w: WeightName) -> TensorLoc {
        let whole = |name: String| TensorLoc {
            name,
            rows: None,
            stacked: None,
            layout: None,
        };
        let (i, lw) = match w {
            WeightName::Layer(i, lw) => (i, lw),
            other => {
                return whole(
                    match (format, other) {
                        (Format::Hf, WeightName::Embed) => "model.embed_tokens.weight",
                        (Format::Hf, WeightName::FinalNorm) => "model.norm.weight",
                        (Format::Hf, _) => "lm_head.weight",
                        (Format::Gguf, WeightName::Embed) => "token_embd.weight",
                        (Format::Gguf, WeightName::FinalNorm) => "output_norm.weight",
                        (Format::Gguf, _) => "output.weight",
                    }
                    .to_string(),
                )
            }
        };
        let prefix = match format {
            Format::Hf => format!("model.layers.{i}."),
            Format::Gguf => format!("blk.{i}."),
        };
        if self.fused {
            let (q, kv, ff) = (c.q_dim(), c.kv_dim(), c.intermediate_size);
            let (qkv, gate_up) = match format {
                Format::Hf => ("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"),
                Format::Gguf => ("attn_qkv.weight", "ffn_up.weight"),
            };
            let part = |name: &str, rows: Range<usize>| TensorLoc {
                name: format!("{prefix}{name}"),
                rows: Some(rows),
                stacked: None,
                layout: None,
            };
            match lw {
                LayerWeight::Q => return part(qkv, 0..q),
                LayerWeight::K => return part(qkv, q..q + kv),
                LayerWeight::V => return part(qkv, q + kv..q + 2 * kv),
                LayerWeight::Gate => return part(gate_up, 0..ff),
                LayerWeight::Up => return part(gate_up, ff..2 * ff),
                _ => {}
            }
        }
        let name = format!("{prefix}{}", self.layer_name(format, lw));
        let layout = match format {
            Format::Hf => self
                .hf_layouts
                .iter()
                .find(|(w, _)| *w == lw)
                .map(|(_, l)| *l),
            Format::Gguf => None,
        };
        let stacked = name
            .contains("{e}")
            .then(|| c.features.moe.as_ref().map(|m| m.routing.num_experts))
            .flatten();
        TensorLoc {
            layout,
            stacked,
            ..whole(name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_projections_are_row_ranges() {
        let mut c = ModelConfig::test_llama(4, 2, 8, 24);
        c.num_layers = 2;
        let fused = TensorNames {
            hf: &[],
            gguf: &[],
            fused: true,
            hf_layouts: &[],
        };
        let k = fused.locate(Format::Hf, &c, WeightName::Layer(1, LayerWeight::K));
        assert_eq!(k.name, "model.layers.1.self_attn.qkv_proj.weight");
        assert_eq!(k.rows, Some(32..48));
        let up = fused.locate(Format::Gguf, &c, WeightName::Layer(0, LayerWeight::Up));
        assert_eq!(
            (up.name.as_str(), up.rows),
            ("blk.0.ffn_up.weight", Some(24..48))
        );
        let o = fused.locate(Format::Gguf, &c, WeightName::Layer(0, LayerWeight::O));
        assert_eq!(
            (o.name.as_str(), o.rows),
            ("blk.0.attn_output.weight", None)
        );
    }

    #[test]
    fn layouts_transpose_and_deinterleave() {
        // One expert, in = 2, 2·out = 4: row i holds [g0 u0 g1 u1] for input i.
        let t = HostTensor::new(vec![1, 2, 4], vec![1., 2., 3., 4., 5., 6., 7., 8.]);
        let gate = Layout::TransposedInterleaved(0).apply(t.clone()).unwrap();
        assert_eq!(
            (gate.shape, gate.data),
            (vec![1, 2, 2], vec![1., 5., 3., 7.])
        );
        let up = Layout::TransposedInterleaved(1).apply(t.clone()).unwrap();
        assert_eq!(up.data, vec![2., 6., 4., 8.]);
        let tr = Layout::Transposed.apply(t).unwrap();
        assert_eq!(
            (tr.shape, tr.data),
            (vec![1, 4, 2], vec![1., 5., 2., 6., 3., 7., 4., 8.])
        );
        let bias = HostTensor::new(vec![2, 4], vec![1., 2., 3., 4., 5., 6., 7., 8.]);
        let ub = Layout::Interleaved(1).apply(bias).unwrap();
        assert_eq!((ub.shape, ub.data), (vec![2, 2], vec![2., 4., 6., 8.]));
    }

    #[test]
    fn overrides_replace_llama_names() {
        let c = ModelConfig::test_llama(4, 2, 8, 24);
        let gemma = TensorNames {
            hf: &[(LayerWeight::FfnNorm, "pre_feedforward_layernorm.weight")],
            gguf: &[],
            fused: false,
            hf_layouts: &[],
        };
        let at = |w| gemma.locate(Format::Hf, &c, WeightName::Layer(0, w)).name;
        assert_eq!(
            at(LayerWeight::FfnNorm),
            "model.layers.0.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            at(LayerWeight::PostAttnNorm),
            "model.layers.0.post_attention_layernorm.weight"
        );
    }
}
