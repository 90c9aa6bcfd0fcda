//! The model registry: from a config.json's `model_type` / `architectures` or a GGUF's
//! `general.architecture` to the family that runs it. Adding a dense family is a file in
//! `families/` and a line in `FAMILIES`.

use super::families;
use super::names::TensorNames;
pub use crate::config::Family;
use crate::config::ModelConfig;
use crate::error::{InferError, Result};
use crate::gguf::GgufFile;
use crate::hf::HfConfig;
use crate::rope::RopeStyle;

/// How one family reads its config and names its tensors.
pub struct FamilySpec {
    pub family: Family,
    /// The registry name, also `ModelConfig::architecture`.
    pub name: &'static str,
    /// config.json `model_type`s and `architectures` entries that are this family.
    pub hf_model_types: &'static [&'static str],
    pub hf_architectures: &'static [&'static str],
    /// GGUF `general.architecture` values that are this family.
    pub gguf_archs: &'static [&'static str],
    /// GGUF Q/K row layout: llama.cpp's converter permutes Q/K rows only for its Llama-derived
    /// model classes.
    pub gguf_rope_style: RopeStyle,
    /// config.json keys beyond the common ones that this family reads (its features); any
    /// other key that changes the math is refused by name (`model::hf_keys`).
    pub hf_keys: &'static [&'static str],
    /// Sets the family's features from config.json (the common fields are already read).
    pub hf_features: fn(&HfConfig, &mut ModelConfig) -> Result<()>,
    /// Sets the family's features from GGUF metadata.
    pub gguf_features: fn(&GgufFile, &mut ModelConfig) -> Result<()>,
    pub names: TensorNames,
}

impl std::fmt::Debug for FamilySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FamilySpec({})", self.name)
    }
}

/// Every family, in the order errors list them.
pub const FAMILIES: &[&FamilySpec] = &[
    &families::llama::SPEC,
    &families::mistral::SPEC,
    &families::qwen2::SPEC,
    &families::qwen3::SPEC,
    &families::gemma2::SPEC,
    &families::gemma3::SPEC,
    &families::phi3::SPEC,
    &families::granite::SPEC,
    &families::olmo2::SPEC,
    &families::olmo3::SPEC,
    &families::qwen3_moe::SPEC,
    &families::mixtral::SPEC,
    &families::gpt_oss::SPEC,
];

/// Architectures users download that we do not run, with what they are, so the error says
/// more than "unknown".
const KNOWN_UNSUPPORTED: &[(&str, &str)] = &[
    (
        "qwen2_moe",
        "a mixture-of-experts model with a shared expert",
    ),
    (
        "qwen2moe",
        "a mixture-of-experts model with a shared expert",
    ),
    (
        "deepseek_v2",
        "a mixture-of-experts model with latent attention",
    ),
    (
        "deepseek_v3",
        "a mixture-of-experts model with latent attention",
    ),
    (
        "deepseek2",
        "a mixture-of-experts model with latent attention",
    ),
    ("granitemoe", "a mixture-of-experts model"),
    ("olmoe", "a mixture-of-experts model"),
    ("gemma3n", "Gemma 3n (per-layer embeddings, AltUp)"),
    ("gemma", "Gemma 1"),
    ("phi", "Phi-1/2 (parallel attention, LayerNorm)"),
    ("phi2", "Phi-1/2 (parallel attention, LayerNorm)"),
    ("stablelm", "StableLM (LayerNorm, partial rotary)"),
    ("gpt_neox", "GPT-NeoX (LayerNorm, parallel residual)"),
    ("gptneox", "GPT-NeoX (LayerNorm, parallel residual)"),
    ("gpt2", "GPT-2 (LayerNorm, learned positions)"),
];

impl Family {
    pub fn spec(self) -> &'static FamilySpec {
        match self {
            Family::Llama => &families::llama::SPEC,
            Family::Mistral => &families::mistral::SPEC,
            Family::Qwen2 => &families::qwen2::SPEC,
            Family::Qwen3 => &families::qwen3::SPEC,
            Family::Gemma2 => &families::gemma2::SPEC,
            Family::Gemma3 => &families::gemma3::SPEC,
            Family::Phi3 => &families::phi3::SPEC,
            Family::Granite => &families::granite::SPEC,
            Family::Olmo2 => &families::olmo2::SPEC,
            Family::Olmo3 => &families::olmo3::SPEC,
            Family::Qwen3Moe => &families::qwen3_moe::SPEC,
            Family::Mixtral => &families::mixtral::SPEC,
            Family::GptOss => &families::gpt_oss::SPEC,
        }
    }
}

/// The supported families, for error messages.
pub fn supported_list() -> String {
    FAMILIES
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn unsupported(name: &str, why: &str) -> InferError {
    let why = KNOWN_UNSUPPORTED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, w)| *w)
        .or((!why.is_empty()).then_some(why))
        .map(|w| format!(": {w}"))
        .unwrap_or_default();
    InferError::UnsupportedArchitecture {
        name: name.to_string(),
        why,
        supported: supported_list(),
    }
}

/// The family of a config.json: `model_type` first, then `architectures`.
pub fn by_hf(model_type: Option<&str>, architectures: &[String]) -> Result<&'static FamilySpec> {
    if let Some(t) = model_type {
        return FAMILIES
            .iter()
            .find(|s| s.hf_model_types.contains(&t))
            .copied()
            .ok_or_else(|| unsupported(t, ""));
    }
    for a in architectures {
        if let Some(s) = FAMILIES
            .iter()
            .find(|s| s.hf_architectures.contains(&a.as_str()))
        {
            return Ok(s);
        }
    }
    Err(unsupported(
        architectures.first().map_or("(none)", |s| s.as_str()),
        "",
    ))
}

/// The family of a GGUF `general.architecture`. llama.cpp writes Mixtral as `llama` with
/// experts; any other dense family whose file declares experts is refused, not run dense.
pub fn by_gguf(arch: &str, expert_count: Option<u64>) -> Result<&'static FamilySpec> {
    let experts = expert_count.is_some_and(|n| n > 0);
    if experts && arch == "llama" {
        return Ok(&families::mixtral::SPEC);
    }
    let spec = FAMILIES
        .iter()
        .find(|s| s.gguf_archs.contains(&arch))
        .copied()
        .ok_or_else(|| unsupported(arch, ""))?;
    if experts && !spec.is_moe() {
        return Err(unsupported(
            arch,
            "a mixture-of-experts variant (its metadata sets `expert_count`)",
        ));
    }
    Ok(spec)
}

impl FamilySpec {
    /// Whether the family routes its MLP through experts.
    pub fn is_moe(&self) -> bool {
        matches!(
            self.family,
            Family::Qwen3Moe | Family::Mixtral | Family::GptOss
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_found_by_its_names() {
        for spec in FAMILIES {
            assert_eq!(spec.family.spec().name, spec.name);
            for t in spec.hf_model_types {
                assert_eq!(by_hf(Some(t), &[]).unwrap().family, spec.family);
            }
            for a in spec.gguf_archs {
                assert_eq!(by_gguf(a, None).unwrap().family, spec.family);
            }
        }
    }

    #[test]
    fn unknown_and_moe_architectures_are_named() {
        let e = by_hf(Some("deepseek_v3"), &[]).unwrap_err().to_string();
        assert!(
            e.contains("`deepseek_v3`: a mixture-of-experts model"),
            "{e}"
        );
        assert!(e.contains("qwen3, gemma2"), "{e}");
        assert_eq!(by_gguf("llama", Some(8)).unwrap().family, Family::Mixtral);
        let e = by_gguf("qwen2", Some(8)).unwrap_err().to_string();
        assert!(
            e.contains("mixture-of-experts") && e.contains("expert_count"),
            "{e}"
        );
        let e = by_hf(None, &["FooForCausalLM".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`FooForCausalLM`"), "{e}");
    }
}
