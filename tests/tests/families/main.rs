//! Every supported family against transformers on the CPU backend, from its HF directory and
//! its llama.cpp-converted GGUF (`scripts/family_models.py`): log-probabilities over the whole
//! vocabulary within 1e-4 and greedy tokens equal, alone and batched under preemption.
//! `metadata_keys`: every key of either format read or refused (issue 58), in the same binary
//! (one link fewer).

mod metadata_keys;

use infer_cpu::CpuBackend;
use infer_tests::conformance::families::{
    check_family, family_cases, load_family, max_logprob_diff, FamilyCase, FamilyFormat,
};

const TOLERANCE: f64 = 1e-4;

#[test]
fn every_family_matches_transformers_on_the_cpu() {
    let mut report = Vec::new();
    for case in family_cases() {
        for format in [FamilyFormat::Hf, FamilyFormat::Gguf] {
            let diff = check_family(CpuBackend::new, &case, format, TOLERANCE);
            report.push(format!("{} {format:?}: {diff:.2e}", case.name));
        }
    }
    eprintln!("max |logprob diff| vs transformers: {}", report.join(", "));
}

/// A copy of `case`'s HF directory with its config.json passed through `edit`: the directory
/// (deleted when the handle drops) and the edited config.
fn edited_hf_copy(
    case: &FamilyCase,
    edit: impl FnOnce(&mut serde_json::Value),
) -> (tempfile::TempDir, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(case.path(FamilyFormat::Hf)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    (dir, config)
}

/// Rewrites a transformers ≥ 5 config.json (`rope_parameters`) in the spelling transformers ≤ 4
/// wrote: `rope_theta`, `partial_rotary_factor` and `rope_local_base_freq` at the top,
/// `rope_scaling` for the full layers' scaling.
fn old_spelling(config: &mut serde_json::Value) {
    let obj = config.as_object_mut().unwrap();
    let params = obj
        .remove("rope_parameters")
        .expect("a transformers 5 config");
    let (mut full, local) = match params.get("full_attention") {
        Some(full) => (full.clone(), params.get("sliding_attention").cloned()),
        None => (params, None),
    };
    let full_obj = full.as_object_mut().unwrap();
    obj.insert("rope_theta".into(), full_obj.remove("rope_theta").unwrap());
    if let Some(p) = full_obj.remove("partial_rotary_factor") {
        obj.insert("partial_rotary_factor".into(), p);
    }
    if let Some(local) = local {
        obj.insert("rope_local_base_freq".into(), local["rope_theta"].clone());
    }
    if full_obj.get("rope_type").and_then(|t| t.as_str()) != Some("default") {
        // transformers 4.3x wrote the type as `type` in older files; take that one.
        let ty = full_obj.remove("rope_type").unwrap();
        full_obj.insert("type".into(), ty);
        obj.insert("rope_scaling".into(), full);
    }
}

#[test]
fn both_config_spellings_give_the_same_logits_for_every_family() {
    for case in family_cases() {
        let new = case.open(FamilyFormat::Hf);
        let (dir, config) = edited_hf_copy(&case, old_spelling);
        assert!(config.get("rope_parameters").is_none());
        let old = infer_core::open_model(dir.path().to_str().unwrap()).unwrap();
        assert_eq!(old.config, new.config, "{}: configs differ", case.name);
        let backend = CpuBackend::new();
        let (a, b) = (
            load_family(&backend, &new, &case.name),
            load_family(&backend, &old, &case.name),
        );
        assert_eq!(
            max_logprob_diff(&backend, &a, &case),
            max_logprob_diff(&backend, &b, &case),
            "{}",
            case.name
        );
    }
}

/// Every real-size config in configs/ (dense, MoE, gpt-oss) parses into its family with the
/// features its file sets.
#[test]
fn every_committed_config_parses() {
    let dir = infer_tests::workspace_root().join("configs");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path().join("config.json");
        if !path.exists() {
            continue;
        }
        let c = infer_core::model::read_config::parse_hf_config(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        seen.push((path, c));
    }
    let find = |name: &str| {
        &seen
            .iter()
            .find(|(p, _)| p.parent().unwrap().ends_with(name))
            .unwrap_or_else(|| panic!("configs/{name}"))
            .1
    };
    let moe = |name: &str| find(name).features.moe.clone().unwrap();
    assert_eq!(moe("qwen3-30b-a3b").routing.num_experts, 128);
    assert_eq!(moe("qwen3-30b-a3b").expert_intermediate_size, 768);
    assert_eq!(moe("mixtral-8x7b").routing.top_k, 2);
    let oss = find("gpt-oss-20b");
    assert!(oss.features.attention_sinks && oss.features.o_bias && oss.attention_bias);
    assert_eq!(oss.features.moe.as_ref().unwrap().routing.num_experts, 32);
    assert_eq!(oss.layer_window(0), Some(128));
    assert_eq!(oss.layer_window(1), None);
    assert!(find("moe-bench-dense").features.moe.is_none());
}

/// A MoE config.json that cannot be right is refused by name before any weight is read:
/// more experts per token than experts, an absurd expert count, gpt-oss's MXFP4 safetensors.
#[test]
fn bad_moe_configs_are_refused_by_name() {
    let cases: [(&str, &str, serde_json::Value, &str); 4] = [
        (
            "qwen3_moe",
            "num_experts_per_tok",
            9.into(),
            "9 experts per token",
        ),
        (
            "mixtral",
            "num_local_experts",
            1_000_000.into(),
            "at most 4096",
        ),
        ("mixtral", "num_local_experts", 0.into(), "of 0 experts"),
        (
            "gpt_oss",
            "quantization_config",
            serde_json::json!({"quant_method": "mxfp4"}),
            "quantization_config",
        ),
    ];
    for (name, key, value, expect) in cases {
        let case = family_cases().into_iter().find(|c| c.name == name).unwrap();
        let (dir, _) = edited_hf_copy(&case, |config| config[key] = value);
        let err = match infer_core::open_model(dir.path().to_str().unwrap()) {
            Ok(_) => panic!("{name} with {key} changed loaded"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(expect), "{name} {key}: {err}");
    }
}
