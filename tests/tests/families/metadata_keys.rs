//! No silently wrong model (issue 58): for every family, generated from the key tables
//! (`infer_core::model::gguf_keys`, `infer_core::model::hf_keys`), a GGUF or config.json that
//! sets a key the family does not read to a value that changes the model is refused naming the
//! key; an inert key is accepted; and every key the table says a family reads is read.

use std::collections::BTreeMap;

use infer_core::gguf::{GgufFile, GgufValue};
use infer_core::model::gguf_keys::{KeyRule, Neutral, Readers, ARCH_KEYS, GLOBAL_KEYS};
use infer_core::model::hf_keys::{self, INERT as HF_INERT, UNREAD as HF_UNREAD};
use infer_core::model::read_config::parse_hf_config;
use infer_core::model::{Family, FAMILIES};
use infer_tests::conformance::families::{family_cases, FamilyFormat};
use serde_json::{json, Value};

/// The key a rule names (a prefix rule gets a name under it).
fn key_of(rule: &KeyRule, arch: &str, arch_rule: bool) -> String {
    let name = match rule.key.strip_suffix('.') {
        Some(prefix) => format!("{prefix}.probe"),
        None => rule.key.to_string(),
    };
    if arch_rule {
        format!("{arch}.{name}")
    } else {
        name
    }
}

/// A value the rule does not count as neutral.
fn changing_value(rule: &KeyRule) -> GgufValue {
    let v = match rule.neutral {
        Neutral::Bool(b) => GgufValue::Bool(!b),
        Neutral::Floats(_) => GgufValue::F32(0.37),
        Neutral::Ints(_) | Neutral::None => GgufValue::U32(7),
    };
    assert!(!rule.is_neutral(&v), "{}", rule.key);
    v
}

/// A GGUF of each family that has one: the converted fixtures, plus Mistral's as other writers
/// label it (arch `mistral`; llama.cpp's converter writes `llama`).
fn family_ggufs() -> BTreeMap<&'static str, (String, BTreeMap<String, GgufValue>)> {
    let mut out = BTreeMap::new();
    for case in family_cases() {
        let path = case.path(FamilyFormat::Gguf);
        let g = GgufFile::open(&path).unwrap();
        let (config, _) = g.read_model().unwrap();
        // The first file of a family (OLMo 3's GGUF is the OLMo 2 family's too).
        let name = config.family.spec().name;
        out.entry(name)
            .or_insert_with(|| (path.display().to_string(), g.metadata.clone()));
        if case.name == "mistral" {
            let renamed = g
                .metadata
                .iter()
                .map(|(k, v)| match k.strip_prefix("llama.") {
                    Some(rest) => (format!("mistral.{rest}"), v.clone()),
                    None if k == "general.architecture" => {
                        (k.clone(), GgufValue::String("mistral".into()))
                    }
                    None => (k.clone(), v.clone()),
                })
                .collect();
            out.insert("mistral", (path.display().to_string(), renamed));
        }
    }
    for spec in FAMILIES.iter().filter(|s| !s.gguf_archs.is_empty()) {
        assert!(
            out.contains_key(spec.name),
            "no GGUF fixture of {}",
            spec.name
        );
    }
    out
}

/// Opens `path` with its metadata replaced by `meta` and `key` set to `value`, reads it as a
/// model: the outcome and the keys read.
fn read_with(
    path: &str,
    meta: &BTreeMap<String, GgufValue>,
    key: &str,
    value: GgufValue,
) -> (Result<Family, String>, std::collections::BTreeSet<String>) {
    let mut g = GgufFile::open(std::path::Path::new(path)).unwrap();
    g.metadata = meta.clone();
    g.metadata.insert(key.to_string(), value);
    let outcome = g
        .read_model()
        .map(|(c, _)| c.family)
        .map_err(|e| e.to_string());
    (outcome, g.keys_read())
}

#[test]
fn every_gguf_key_a_family_does_not_read_is_refused_by_name_and_inert_ones_pass() {
    let ggufs = family_ggufs();
    let mut refused = 0;
    for (name, (path, meta)) in &ggufs {
        let family = FAMILIES.iter().find(|s| s.name == *name).unwrap().family;
        let arch = meta["general.architecture"].as_str().unwrap().to_string();
        let rows = ARCH_KEYS
            .iter()
            .map(|r| (r, true))
            .chain(GLOBAL_KEYS.iter().map(|r| (r, false)));
        for (rule, arch_rule) in rows {
            let key = key_of(rule, &arch, arch_rule);
            if rule.inert {
                let (outcome, _) = read_with(path, meta, &key, GgufValue::U32(7));
                assert_eq!(outcome, Ok(family), "{name}: inert `{key}` refused");
            } else if !rule.read_by(family) {
                let (outcome, _) = read_with(path, meta, &key, changing_value(rule));
                let err = outcome.expect_err(&format!("{name}: `{key}` accepted unread"));
                assert!(err.contains(&format!("`{key}`")), "{name}: {err}");
                refused += 1;
            } else if !meta.contains_key(&key) {
                // Declared read: the loader asks for it, whatever it then makes of the value.
                let (_, read) = read_with(path, meta, &key, GgufValue::U32(1));
                assert!(
                    read.contains(&key),
                    "{name}: the table says it reads `{key}`; it does not"
                );
            }
        }
        // A key of the architecture's namespace that nobody knows.
        let key = format!("{arch}.attention.made_up_key");
        let (outcome, _) = read_with(path, meta, &key, GgufValue::U32(1));
        assert!(
            outcome.unwrap_err().contains("neither infer nor llama.cpp"),
            "{name}"
        );
    }
    eprintln!(
        "{refused} unread keys refused across {} families",
        ggufs.len()
    );
    assert!(refused > 1000, "only {refused} refusals checked");
}

#[test]
fn a_key_the_file_gives_a_neutral_value_is_accepted() {
    let ggufs = family_ggufs();
    let (path, meta) = &ggufs["qwen3"];
    for (key, value) in [
        ("qwen3.attention.causal", GgufValue::Bool(true)),
        ("qwen3.attention.sliding_window", GgufValue::U32(0)),
        ("qwen3.expert_count", GgufValue::U32(0)),
        ("qwen3.nextn_predict_layers", GgufValue::U32(0)),
        ("tokenizer.ggml.add_sep_token", GgufValue::Bool(false)),
        ("split.count", GgufValue::U32(1)),
    ] {
        let (outcome, _) = read_with(path, meta, key, value);
        assert_eq!(outcome, Ok(Family::Qwen3), "{key}");
    }
    let (outcome, _) = read_with(path, meta, "split.count", GgufValue::U32(3));
    assert!(outcome.unwrap_err().contains("llama-gguf-split --merge"));
    let (outcome, _) = read_with(
        path,
        meta,
        "general.type",
        GgufValue::String("adapter".into()),
    );
    assert!(outcome.unwrap_err().contains("not a model"));
}

/// Where a GGUF cannot say what the model is, infer follows llama.cpp's reading and says so.
#[test]
fn assumptions_where_a_gguf_is_silent_are_said_at_load() {
    let ggufs = family_ggufs();
    let assumed = |name: &str, drop: &[&str]| {
        let (path, meta) = &ggufs[name];
        let mut g = GgufFile::open(std::path::Path::new(path)).unwrap();
        g.metadata = meta.clone();
        for k in drop {
            g.metadata.retain(|key, _| !key.ends_with(k));
        }
        let (config, _) = g.read_model().unwrap();
        (config, g.assumptions().join("\n"))
    };
    let (gemma3, said) = assumed("gemma3", &[]);
    assert!(
        said.contains("no layer pattern") && said.contains("five sliding layers to each full one"),
        "{said}"
    );
    assert_eq!(
        gemma3.features.sliding_layers,
        [true, true, true, true, true, false]
    );
    assert!(said.contains("query_pre_attn_scalar"), "{said}");
    let (gemma2, said) = assumed(
        "gemma2",
        &[".attn_logit_softcapping", ".attention.sliding_window"],
    );
    assert!(
        said.contains("attn_logit_softcapping") && said.contains("4096"),
        "{said}"
    );
    assert_eq!(gemma2.features.attn_logit_softcap, Some(50.0));
    assert_eq!(gemma2.features.sliding_window, Some(4096));
    let (olmo, said) = assumed("olmo2", &[]);
    assert!(
        said.is_empty() && olmo.features.sliding_window.is_none(),
        "{said}"
    );
    let (moe, said) = assumed("qwen3_moe", &[]);
    assert!(said.contains("renormalizing"), "{said}");
    assert!(moe.features.moe.is_some());
}

/// OLMo 3's GGUF (llama.cpp's `olmo2` with window keys) reads as llama.cpp reads it: three
/// sliding layers to one full, sliding layers unscaled, full ones with YaRN.
#[test]
fn olmo3_gguf_reads_its_window_keys_and_pattern() {
    let case = family_cases()
        .into_iter()
        .find(|c| c.name == "olmo3")
        .unwrap();
    let gguf = case.open(FamilyFormat::Gguf).config;
    let hf = case.open(FamilyFormat::Hf).config;
    assert_eq!(gguf.architecture, "olmo2");
    assert_eq!(hf.architecture, "olmo3");
    for c in [&gguf, &hf] {
        assert_eq!(c.features.sliding_window, Some(8));
        assert_eq!(c.features.sliding_layers, [true, true, true, false]);
        assert!(c.layer_rope(0).scaling.is_none());
        assert!(matches!(
            c.layer_rope(3).scaling,
            Some(infer_core::RopeScaling::Yarn { .. })
        ));
    }
    // Without its pattern, llama.cpp's period of four, said at load.
    let g = GgufFile::open(&case.path(FamilyFormat::Gguf)).unwrap();
    let mut g2 = GgufFile::open(&case.path(FamilyFormat::Gguf)).unwrap();
    g2.metadata = g.metadata.clone();
    g2.metadata.remove("olmo2.attention.sliding_window_pattern");
    let (c, _) = g2.read_model().unwrap();
    assert_eq!(c.features.sliding_layers, [true, true, true, false]);
    assert!(g2
        .assumptions()
        .join(" ")
        .contains("three sliding layers to each full one"));
}

/// A config.json value that `neutral` does not accept.
fn changing_json(neutral: hf_keys::Neutral) -> Value {
    match neutral {
        hf_keys::Neutral::ListOf(_) => json!(["something_else"]),
        hf_keys::Neutral::Json(_) => json!(123.5),
    }
}

fn parse_with(
    case_config: &Value,
    edit: impl FnOnce(&mut Value),
) -> Result<infer_core::ModelConfig, String> {
    let dir = tempfile::tempdir().unwrap();
    let mut config = case_config.clone();
    edit(&mut config);
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    parse_hf_config(&path).map_err(|e| e.to_string())
}

#[test]
fn every_config_key_a_family_does_not_read_is_refused_by_name_and_inert_ones_pass() {
    let mut families_seen = std::collections::BTreeSet::new();
    for case in family_cases() {
        let path = case.path(FamilyFormat::Hf).join("config.json");
        let config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let spec = parse_hf_config(&path).unwrap().family.spec();
        families_seen.insert(spec.name);
        for (key, neutral, _) in HF_UNREAD
            .iter()
            .filter(|(k, _, _)| !spec.hf_keys.contains(k))
        {
            let err = parse_with(&config, |c| c[*key] = changing_json(*neutral))
                .expect_err(&format!("{}: `{key}` accepted unread", spec.name));
            assert!(err.contains(&format!("`{key}`")), "{}: {err}", spec.name);
        }
        for (key, _) in HF_INERT {
            parse_with(&config, |c| c[*key] = json!(7))
                .unwrap_or_else(|e| panic!("{}: inert `{key}` refused: {e}", spec.name));
        }
        let err = parse_with(&config, |c| c["made_up_key"] = json!(true)).unwrap_err();
        assert!(
            err.contains("`made_up_key`") && err.contains("not a config key infer knows"),
            "{err}"
        );
        // RoPE: an unknown type, and a parameter nothing reads, both by name.
        let rope_key = if config.get("rope_parameters").is_some() {
            "rope_parameters"
        } else {
            "rope_scaling"
        };
        let nested = config[rope_key].get("full_attention").is_some();
        let err = parse_with(&config, |c| {
            let p = if nested {
                &mut c[rope_key]["full_attention"]
            } else {
                &mut c[rope_key]
            };
            p["rope_type"] = json!("dynamic_ntk_whatever");
        })
        .unwrap_err();
        assert!(err.contains("dynamic_ntk_whatever"), "{}: {err}", spec.name);
        let err = parse_with(&config, |c| {
            let p = if nested {
                &mut c[rope_key]["full_attention"]
            } else {
                &mut c[rope_key]
            };
            p["mrope_section"] = json!([2, 2]);
        })
        .unwrap_err();
        assert!(err.contains("mrope_section`"), "{}: {err}", spec.name);
        // A layer type infer does not run, named whether or not the family has windows.
        let n = usize::try_from(config["num_hidden_layers"].as_u64().unwrap()).unwrap();
        let err = parse_with(&config, |c| {
            let mut types = vec![json!("full_attention"); n];
            types[0] = json!("chunked_attention");
            c["layer_types"] = Value::Array(types);
        })
        .unwrap_err();
        assert!(err.contains("chunked_attention"), "{}: {err}", spec.name);
    }
    for spec in FAMILIES {
        assert!(
            families_seen.contains(spec.name),
            "no config.json fixture of {}",
            spec.name
        );
    }
}

/// Gemma 3's older configs say which layers slide with a period; one that disagrees with
/// `layer_types` is refused rather than one of them ignored.
#[test]
fn gemma3_pattern_keys_are_read_and_must_agree() {
    let case = family_cases()
        .into_iter()
        .find(|c| c.name == "gemma3")
        .unwrap();
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(case.path(FamilyFormat::Hf).join("config.json")).unwrap(),
    )
    .unwrap();
    let err = parse_with(&config, |c| c["_sliding_window_pattern"] = json!(3)).unwrap_err();
    assert!(err.contains("disagree"), "{err}");
    let c = parse_with(&config, |c| {
        c.as_object_mut().unwrap().remove("layer_types");
        c.as_object_mut().unwrap().remove("_sliding_window_pattern");
        c["sliding_window_pattern"] = json!(3);
    })
    .unwrap();
    assert_eq!(
        c.features.sliding_layers,
        [true, true, false, true, true, false]
    );
}

/// Nothing in the tables is listed twice or both read and inert.
#[test]
fn the_tables_are_consistent() {
    let mut seen = std::collections::BTreeSet::new();
    for rule in ARCH_KEYS.iter().chain(GLOBAL_KEYS) {
        assert!(seen.insert(rule.key), "`{}` twice", rule.key);
        assert!(
            !(rule.inert && rule.readers != Readers::None),
            "`{}`",
            rule.key
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for key in hf_keys::COMMON
        .iter()
        .chain(HF_INERT.iter().map(|(k, _)| k))
        .chain(HF_UNREAD.iter().map(|(k, _, _)| k))
    {
        assert!(seen.insert(*key), "config key `{key}` twice");
    }
}

/// `general.sampling.*` as the converter writes them (top_k and penalty_last_n as i32, -1 for
/// the whole context) become a generation config; a window the sampler cannot follow is refused.
#[test]
fn gguf_sampling_recommendations_read_as_a_generation_config() {
    let ggufs = family_ggufs();
    let (path, meta) = &ggufs["qwen3"];
    let mut g = GgufFile::open(std::path::Path::new(path)).unwrap();
    g.metadata = meta.clone();
    for (k, v) in [
        ("temp", GgufValue::F32(0.5)),
        ("top_k", GgufValue::I32(20)),
        ("penalty_repeat", GgufValue::F32(1.25)),
        ("penalty_last_n", GgufValue::I32(-1)),
    ] {
        g.metadata.insert(format!("general.sampling.{k}"), v);
    }
    let config = g.sampling_defaults().unwrap();
    assert_eq!(config["temperature"], json!(0.5));
    assert_eq!(config["top_k"], json!(20));
    assert_eq!(config["repetition_penalty"], json!(1.25));
    g.metadata
        .insert("general.sampling.penalty_last_n".into(), GgufValue::I32(64));
    let err = g.sampling_defaults().unwrap_err().to_string();
    assert!(err.contains("general.sampling.penalty_last_n"), "{err}");
}
