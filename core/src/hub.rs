//! Resolves `--model`: a GGUF file, an HF model directory, or a Hugging Face hub id fetched into
//! the HF cache with `hf-hub` (the cache is used first, so offline machines work once populated).

use std::path::{Path, PathBuf};

use crate::error::{InferError, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelLocation {
    Gguf(PathBuf),
    HfDir(PathBuf),
}

pub fn resolve(spec: &str) -> Result<ModelLocation> {
    let path = Path::new(spec);
    if path.is_file() {
        return Ok(ModelLocation::Gguf(path.to_path_buf()));
    }
    if path.is_dir() {
        return resolve_dir(path);
    }
    if looks_like_hub_id(spec) {
        return fetch_from_hub(spec).map(ModelLocation::HfDir);
    }
    Err(InferError::ModelNotFound(spec.to_string()))
}

fn resolve_dir(dir: &Path) -> Result<ModelLocation> {
    if dir.join("config.json").is_file() {
        return Ok(ModelLocation::HfDir(dir.to_path_buf()));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| InferError::io(dir, e))?;
    let ggufs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    match ggufs.as_slice() {
        [one] => Ok(ModelLocation::Gguf(one.clone())),
        [] => Err(InferError::ModelDir {
            path: dir.to_path_buf(),
            reason: "no config.json and no .gguf file".into(),
        }),
        _ => Err(InferError::ModelDir {
            path: dir.to_path_buf(),
            reason: format!("{} .gguf files; pass one of them", ggufs.len()),
        }),
    }
}

fn looks_like_hub_id(spec: &str) -> bool {
    let mut parts = spec.split('/');
    let ok = |s: Option<&str>| {
        s.is_some_and(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
const OPTIONAL: [&str; 3] = [
    "tokenizer_config.json",
    "generation_config.json",
    "model.safetensors.index.json",
];

fn fetch_from_hub(id: &str) -> Result<PathBuf> {
    let cache = hf_hub::Cache::from_env().model(id.to_string());
    let offline =
        std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let api = if offline {
        None
    } else {
        Some(
            hf_hub::api::sync::ApiBuilder::from_env()
                .build()
                .map_err(|e| InferError::Hub(format!("cannot start the hub client: {e}")))?
                .model(id.to_string()),
        )
    };
    let get = |file: &str| -> Result<Option<PathBuf>> {
        if let Some(p) = cache.get(file) {
            return Ok(Some(p));
        }
        let Some(api) = &api else { return Ok(None) };
        match api.get(file) {
            Ok(p) => Ok(Some(p)),
            // Optional files (a tokenizer_config.json, a shard index) may be absent.
            Err(hf_hub::api::sync::ApiError::RequestError(e)) if matches!(*e, ureq::Error::Status(404, _)) => Ok(None),
            Err(e) => Err(InferError::Hub(format!(
                "could not fetch `{file}` of `{id}`: {e}. Without network access, pass a local GGUF file or HF directory, or fill the HF cache first"
            ))),
        }
    };
    let mut dir = None;
    for file in REQUIRED {
        let p = get(file)?.ok_or_else(|| {
            InferError::Hub(if offline {
                format!("`{id}` is not in the HF cache (HF_HUB_OFFLINE is set): `{file}` missing")
            } else {
                format!("`{id}` has no `{file}`")
            })
        })?;
        dir = p.parent().map(Path::to_path_buf);
    }
    for file in OPTIONAL {
        get(file)?;
    }
    let dir = dir.ok_or_else(|| InferError::Hub(format!("`{id}`: no snapshot directory")))?;
    let index = dir.join("model.safetensors.index.json");
    let shards: Vec<String> = if index.is_file() {
        let idx: serde_json::Value = crate::hf::read_json(&index)?;
        let mut files: Vec<String> = idx
            .get("weight_map")
            .and_then(|m| m.as_object())
            .map(|m| {
                m.values()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files.dedup();
        files
    } else {
        vec!["model.safetensors".into()]
    };
    for shard in shards {
        get(&shard)?.ok_or_else(|| InferError::Hub(format!("`{id}` has no `{shard}`")))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_are_org_slash_name() {
        assert!(looks_like_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(!looks_like_hub_id("models/a/b.gguf"));
        assert!(!looks_like_hub_id("plain"));
        assert!(!looks_like_hub_id("a/ b"));
    }

    #[test]
    fn missing_path_is_a_clear_error() {
        let e = resolve("/nonexistent/model.gguf").unwrap_err();
        assert!(matches!(e, InferError::ModelNotFound(_)), "{e}");
    }

    #[test]
    fn offline_hub_id_not_in_cache_says_so() {
        let cache = tempfile::tempdir().unwrap();
        std::env::set_var("HF_HOME", cache.path());
        std::env::set_var("HF_HUB_OFFLINE", "1");
        let e = resolve("no-such-org/no-such-model").unwrap_err();
        assert!(e.to_string().contains("not in the HF cache"), "{e}");
    }
}
