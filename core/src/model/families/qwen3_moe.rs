//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head q/k norms) with a
//! routed MLP: a softmax over `num_experts` router logits, the top `num_experts_per_tok`,
//! renormalised when `norm_topk_prob`; each expert a SwiGLU of `moe_intermediate_size`.
//! `mlp_only_layers` and `decoder_sparse_step` keep some layers dense (`intermediate_size`).

use super::{gguf_moe, hf_moe};
use crate::config::{ModelConfig, MoeScoring, QkNorm};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::rope::RopeStyle;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Qwen3Moe,
    name: "qwen3_moe",
    hf_model_types: &["qwen3_moe"],
    hf_architectures: &["Qwen3MoeForCausalLM"],
    gguf_archs: &["qwen3moe"],
    gguf_rope_style: RopeStyle::HalfSplit,
    // Released configs say `num_experts`; transformers 5 writes `num_local_experts`.
    hf_keys: &[
        "use_sliding_window",
        "sliding_window",
        "max_window_layers",
        "num_experts",
        "num_local_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
        "decoder_sparse_step",
        "mlp_only_layers",
    ],
    hf_features,
    gguf_features,
    names: TensorNames::LLAMA,
};

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    c.features.qk_norm = Some(QkNorm::PerHead);
    super::hf_qwen_window(hf)?;
    let renormalize = hf.bool("norm_topk_prob")?.unwrap_or(false);
    let experts_key = match (hf.usize("num_experts")?, hf.usize("num_local_experts")?) {
        (Some(a), Some(b)) if a != b => {
            return Err(hf.bad(format!(
                "`num_experts` = {a} and `num_local_experts` = {b} disagree"
            )))
        }
        (Some(_), _) => "num_experts",
        _ => "num_local_experts",
    };
    let mut moe = hf_moe(
        hf,
        c,
        experts_key,
        Some("moe_intermediate_size"),
        MoeScoring::SoftmaxTopK { renormalize },
    )?;
    // As transformers decides: routed unless listed in `mlp_only_layers`, on every
    // `decoder_sparse_step`-th layer.
    let step = hf.usize("decoder_sparse_step")?.unwrap_or(1);
    let dense: Vec<usize> = match hf.get("mlp_only_layers") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| hf.bad(format!("`mlp_only_layers` is {v}, expected layer numbers")))?,
    };
    if step == 0 {
        return Err(hf.bad("`decoder_sparse_step` is 0"));
    }
    let sparse: Vec<bool> = (0..c.num_layers)
        .map(|i| !dense.contains(&i) && (i + 1).is_multiple_of(step))
        .collect();
    if sparse.iter().any(|s| !s) {
        moe.sparse_layers = sparse;
    }
    c.features.moe = Some(moe);
    Ok(())
}

/// llama.cpp runs every layer routed and renormalises the top-k weights for this architecture
/// (its converter keeps neither `norm_topk_prob` nor dense layers); a file that says
/// `expert_weights_norm` is taken at its word.
fn gguf_features(gguf: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    c.features.qk_norm = Some(QkNorm::PerHead);
    let renormalize = match gguf.arch_bool("expert_weights_norm")? {
        Some(norm) => norm,
        None => {
            let key = gguf.arch_key("expert_weights_norm");
            gguf.assume(format!(
                "GGUF has no `{key}` (norm_topk_prob): renormalizing each token's top-k expert weights, as llama.cpp does"
            ));
            true
        }
    };
    c.features.moe = Some(gguf_moe(gguf, c, MoeScoring::SoftmaxTopK { renormalize })?);
    Ok(())
}
