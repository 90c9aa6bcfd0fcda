//! Weights from memory-mapped safetensors shards (native only: the browser streams GGUF).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use serde::Deserialize;

use super::read_json;
use crate::error::{InferError, Result};
use crate::model::names::Format;
use crate::weights::{HostTensor, TensorStore};

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    header_len: usize,
    metadata: Metadata,
}

/// The safetensors weights of an HF model directory.
pub struct SafetensorsWeights {
    dir: PathBuf,
    shards: Vec<Shard>,
    /// tensor name → shard index
    index: HashMap<String, usize>,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

impl SafetensorsWeights {
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<String> = if index_path.exists() {
            let idx: ShardIndex = read_json(&index_path)?;
            let mut f: Vec<String> = idx.weight_map.into_values().collect();
            f.sort();
            f.dedup();
            f
        } else if dir.join("model.safetensors").exists() {
            vec!["model.safetensors".into()]
        } else {
            return Err(InferError::ModelDir {
                path: dir.to_path_buf(),
                reason: "no model.safetensors or model.safetensors.index.json".into(),
            });
        };
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        for name in files {
            let path = dir.join(&name);
            let file = File::open(&path).map_err(|e| InferError::io(&path, e))?;
            // SAFETY: read-only map kept alive by `Shard`; the file is assumed not to be
            // truncated while the process runs (the usual mmap loader contract).
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| InferError::io(&path, e))?;
            let (header_len, metadata) =
                SafeTensors::read_metadata(&mmap).map_err(|e| InferError::Safetensors {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            for tensor in metadata.tensors().keys() {
                index.insert(tensor.clone(), shards.len());
            }
            shards.push(Shard {
                path,
                mmap,
                header_len,
                metadata,
            });
        }
        Ok(SafetensorsWeights {
            dir: dir.to_path_buf(),
            shards,
            index,
        })
    }
}

fn convert(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

impl TensorStore for SafetensorsWeights {
    fn source_name(&self) -> String {
        self.dir.display().to_string()
    }

    fn format(&self) -> Format {
        Format::Hf
    }

    fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn read(&self, name: &str) -> Result<HostTensor> {
        let missing = || InferError::MissingTensor {
            name: name.to_string(),
            source_name: self.source_name(),
        };
        let shard = &self.shards[*self.index.get(name).ok_or_else(missing)?];
        let info = shard.metadata.info(name).ok_or_else(missing)?;
        let (start, end) = info.data_offsets;
        let base = 8 + shard.header_len;
        // read_metadata validated that the offsets tile the buffer; check anyway, cheaply.
        let bytes =
            shard
                .mmap
                .get(base + start..base + end)
                .ok_or_else(|| InferError::Safetensors {
                    path: shard.path.clone(),
                    reason: format!("tensor `{name}` lies outside the file"),
                })?;
        let data = convert(info.dtype, bytes).ok_or_else(|| InferError::UnsupportedDtype {
            name: name.to_string(),
            dtype: format!("{:?}", info.dtype),
        })?;
        Ok(HostTensor::new(info.shape.clone(), data))
    }
}
