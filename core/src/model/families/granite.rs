//! IBM Granite 3: Llama's block with four multipliers: on the embeddings, on each residual
//! branch, as the attention softmax scale, and a divisor of the final logits.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::model::names::TensorNames;
use crate::model::registry::{Family, FamilySpec};
use crate::narrow::f32_of;
use crate::rope::RopeStyle;

pub const SPEC: FamilySpec = FamilySpec {
    family: Family::Granite,
    name: "granite",
    hf_model_types: &["granite"],
    hf_architectures: &["GraniteForCausalLM"],
    gguf_archs: &["granite"],
    // llama.cpp converts Granite with its Llama class, Q/K rows permuted.
    gguf_rope_style: RopeStyle::AdjacentPairs,
    hf_keys: &[
        "embedding_multiplier",
        "residual_multiplier",
        "attention_multiplier",
        "logits_scaling",
    ],
    hf_features,
    gguf_features,
    names: TensorNames::LLAMA,
};

fn set(
    c: &mut ModelConfig,
    emb: Option<f64>,
    res: Option<f64>,
    att: Option<f64>,
    logits: Option<f64>,
) {
    let f = &mut c.features;
    f.embedding_scale = emb.map(f32_of);
    f.residual_scale = res.map(f32_of);
    f.attention_scale = att.map(f32_of);
    f.logits_scale = logits.map(|x| f32_of(1.0 / x));
}

fn hf_features(hf: &HfConfig, c: &mut ModelConfig) -> Result<()> {
    let (emb, res) = (
        hf.f64("embedding_multiplier")?,
        hf.f64("residual_multiplier")?,
    );
    let (att, logits) = (hf.f64("attention_multiplier")?, hf.f64("logits_scaling")?);
    set(c, emb, res, att, logits);
    Ok(())
}

fn gguf_features(g: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    // llama.cpp's Granite turns RoPE off on every layer when this is false (a NoPE model).
    if g.arch_bool("rope.scaling.finetuned")? == Some(false) {
        return Err(g.bad(format!(
            "metadata `{}` = false: a Granite without RoPE is not supported",
            g.arch_key("rope.scaling.finetuned")
        )));
    }
    let (emb, res) = (
        g.arch_f64("embedding_scale")?,
        g.arch_f64("residual_scale")?,
    );
    let (att, logits) = (g.arch_f64("attention.scale")?, g.arch_f64("logit_scale")?);
    set(c, emb, res, att, logits);
    Ok(())
}
