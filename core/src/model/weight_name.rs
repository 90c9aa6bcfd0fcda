//! The weights the forward asks for, named independently of any file format (`names.rs` maps
//! them to each format's tensor names), with the shape each must have.

use crate::config::{ModelConfig, QkNorm};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerWeight {
    /// The norm before attention.
    AttnNorm,
    Q,
    K,
    V,
    QBias,
    KBias,
    VBias,
    /// RMSNorm weights of the queries and keys (`QkNorm`).
    QNorm,
    KNorm,
    O,
    /// The norm of attention's output (Gemma's sandwich, OLMo 2).
    PostAttnNorm,
    /// The norm before the MLP.
    FfnNorm,
    Gate,
    Up,
    Down,
    /// The norm of the MLP's output.
    PostFfnNorm,
    /// The router of a mixture of experts, `[experts, hidden]`.
    Router,
    /// Every expert's gate, up and down projections stacked: `[experts, ff, hidden]` and
    /// `[experts, hidden, ff]` (GGUF's 3-D `ffn_*_exps`).
    ExpGate,
    ExpUp,
    ExpDown,
    /// gpt-oss: the router's bias `[experts]`, the experts' biases `[experts, ff]` (gate, up)
    /// and `[experts, hidden]` (down), o_proj's bias `[hidden]` and the attention sinks
    /// `[heads]`.
    RouterBias,
    ExpGateBias,
    ExpUpBias,
    ExpDownBias,
    OBias,
    Sinks,
}

impl LayerWeight {
    /// One of the stacked expert tensors.
    pub fn is_experts(self) -> bool {
        matches!(
            self,
            LayerWeight::ExpGate | LayerWeight::ExpUp | LayerWeight::ExpDown
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightName {
    Embed,
    FinalNorm,
    LmHead,
    Layer(usize, LayerWeight),
}

impl WeightName {
    /// The shape the forward expects, row-major, linear weights as `[out, in]`.
    pub fn expected_shape(self, c: &ModelConfig) -> Vec<usize> {
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let qk_norm = |whole: usize| match c.features.qk_norm {
            Some(QkNorm::Whole) => vec![whole],
            _ => vec![c.head_dim],
        };
        match self {
            WeightName::Embed | WeightName::LmHead => vec![c.vocab_size, h],
            WeightName::FinalNorm => vec![h],
            WeightName::Layer(_, w) => match w {
                LayerWeight::AttnNorm
                | LayerWeight::FfnNorm
                | LayerWeight::PostAttnNorm
                | LayerWeight::PostFfnNorm => vec![h],
                LayerWeight::Q => vec![q, h],
                LayerWeight::K | LayerWeight::V => vec![kv, h],
                LayerWeight::QBias => vec![q],
                LayerWeight::KBias | LayerWeight::VBias => vec![kv],
                LayerWeight::QNorm => qk_norm(q),
                LayerWeight::KNorm => qk_norm(kv),
                LayerWeight::O => vec![h, q],
                LayerWeight::Gate | LayerWeight::Up => vec![ff, h],
                LayerWeight::Down => vec![h, ff],
                LayerWeight::OBias => vec![h],
                LayerWeight::Sinks => vec![c.num_heads],
                LayerWeight::Router
                | LayerWeight::ExpGate
                | LayerWeight::ExpUp
                | LayerWeight::ExpDown
                | LayerWeight::RouterBias
                | LayerWeight::ExpGateBias
                | LayerWeight::ExpUpBias
                | LayerWeight::ExpDownBias => {
                    let Some(moe) = &c.features.moe else {
                        return vec![0];
                    };
                    let (e, eff) = (moe.routing.num_experts, moe.expert_intermediate_size);
                    match w {
                        LayerWeight::Router => vec![e, h],
                        LayerWeight::ExpDown => vec![e, h, eff],
                        LayerWeight::RouterBias => vec![e],
                        LayerWeight::ExpGateBias | LayerWeight::ExpUpBias => vec![e, eff],
                        LayerWeight::ExpDownBias => vec![e, h],
                        _ => vec![e, eff, h],
                    }
                }
            },
        }
    }

    /// An RMSNorm weight (a vector the forward takes as f32, never a matrix).
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            WeightName::FinalNorm
                | WeightName::Layer(
                    _,
                    LayerWeight::AttnNorm
                        | LayerWeight::FfnNorm
                        | LayerWeight::PostAttnNorm
                        | LayerWeight::PostFfnNorm
                        | LayerWeight::QNorm
                        | LayerWeight::KNorm
                )
        )
    }

    /// A vector (norm or bias), uploaded as f32; everything else is a matrix.
    pub fn is_vector(self) -> bool {
        self.is_norm()
            || matches!(
                self,
                WeightName::Layer(
                    _,
                    LayerWeight::QBias
                        | LayerWeight::KBias
                        | LayerWeight::VBias
                        | LayerWeight::OBias
                        | LayerWeight::Sinks
                        | LayerWeight::RouterBias
                        | LayerWeight::ExpGateBias
                        | LayerWeight::ExpUpBias
                        | LayerWeight::ExpDownBias
                )
            )
    }
}
