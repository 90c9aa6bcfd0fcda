//! Mixtral: Mistral's block with a routed MLP: the top `num_experts_per_tok` of
//! `num_local_experts` experts by router softmax, their weights renormalised. llama.cpp writes
//! it as GGUF arch `llama` with `llama.expert_count`.

use super::{gguf_moe, hf_moe, hf_window};
use crate::config::{ModelConfig, MoeScoring};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::RopeStyle;
use crate::weights::LayerWeight;

const SCORING: MoeScoring = MoeScoring::SoftmaxTopK { renormalize: true };

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Mixtral,
    name: "mixtral",
    hf_model_types: &["mixtral"],
    hf_architectures: &["MixtralForCausalLM"],
    gguf_archs: &["mixtral"],
    gguf_rope_style: RopeStyle::AdjacentPairs,
    hf_keys: &[
        "sliding_window",
        "layer_types",
        "num_local_experts",
        "num_experts_per_tok",
    ],
    hf_features,
    gguf_features,
    names: TensorNames {
        hf: &[
            (LayerWeight::Router, "block_sparse_moe.gate.weight"),
            (
                LayerWeight::ExpGate,
                "block_sparse_moe.experts.{e}.w1.weight",
            ),
            (LayerWeight::ExpUp, "block_sparse_moe.experts.{e}.w3.weight"),
            (
                LayerWeight::ExpDown,
                "block_sparse_moe.experts.{e}.w2.weight",
            ),
        ],
        gguf: &[],
        fused: false,
        hf_layouts: &[],
    },
};

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    hf_window(hf, c)?;
    c.features.moe = Some(hf_moe(hf, c, "num_local_experts", None, SCORING)?);
    Ok(())
}

fn gguf_features(gguf: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    super::gguf_window(gguf, c, None)?;
    c.features.moe = Some(gguf_moe(gguf, c, SCORING)?);
    Ok(())
}
