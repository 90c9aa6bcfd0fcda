//! Random weights for a model config (`--load-format dummy`, as vLLM's benchmarks use): the
//! shapes, and so the speed, of a model we have no weights for. Values are deterministic per
//! weight and seed, uniform in ±0.035 (about the spread of a 0.02-std init); norms are ones.
//! Matrices can come as random quantized blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K), so an 8B
//! model fits a small machine and the packed kernels run at real sizes.

use std::path::Path;

use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::error::{InferError, Result};
use crate::gguf::GgmlType;
use crate::gguf::GgufFile;
use crate::hub::{resolve, ModelLocation};
use crate::model::read_config::parse_hf_config;
use crate::tokenizer::Tokenizer;
use crate::weights::{HostTensor, LayerWeight, PackedTensor, WeightName, WeightSource};

pub struct DummyWeights {
    config: ModelConfig,
    seed: u64,
    /// Matrices as random blocks of this type instead of f32: real-size models in an eighth
    /// (Q4) to a quarter (Q8_0) of the memory, and the packed kernels' speed.
    packed: Option<GgmlType>,
}

impl DummyWeights {
    pub fn new(config: ModelConfig, seed: u64) -> Self {
        DummyWeights {
            config,
            seed,
            packed: None,
        }
    }

    /// Matrices as random `dtype` blocks (`RANDOM_BLOCK_TYPES`); other types are refused by
    /// name.
    pub fn packed(self, dtype: GgmlType) -> Result<Self> {
        if block_scales(dtype).is_none() {
            let names: Vec<_> = RANDOM_BLOCK_TYPES.iter().map(|t| t.name()).collect();
            return Err(InferError::invalid(
                "dummy dtype",
                format!("{} (supported: f32, {})", dtype.name(), names.join(", ")),
            ));
        }
        Ok(DummyWeights {
            packed: Some(dtype),
            ..self
        })
    }
}

/// Where each quant type keeps its f16 scales, and the values that spread its weights over
/// about ±0.035 like the f32 ones (random quants, random 6-bit sub-scales for K-quants).
fn block_scales(dtype: GgmlType) -> Option<&'static [(usize, f32)]> {
    Some(match dtype {
        // Quants −128..127.
        GgmlType::Q8_0 => &[(0, 0.035 / 127.0)],
        // Codes 0..16 around 8.
        GgmlType::Q4_0 => &[(0, 0.035 / 8.0)],
        // d · 0..15 + m.
        GgmlType::Q4_1 => &[(0, 0.07 / 15.0), (2, -0.035)],
        // d · sc · q − dmin · m, sc and m 0..63.
        GgmlType::Q4K => &[(0, 0.07 / (15.0 * 63.0)), (2, 0.035 / 63.0)],
        GgmlType::Q5K => &[(0, 0.07 / (31.0 * 63.0)), (2, 0.035 / 63.0)],
        // d · sc · (q − 32), sc −128..127.
        GgmlType::Q6K => &[(208, 0.035 / (128.0 * 32.0))],
        _ => return None,
    })
}

/// The quant types `random_blocks` makes.
pub const RANDOM_BLOCK_TYPES: [GgmlType; 6] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Random blocks of `dtype` (one of `RANDOM_BLOCK_TYPES`, else `None`) for a `[rows, cols]`
/// matrix, `cols` a whole number of blocks: random quants under fixed scales.
pub fn random_blocks(dtype: GgmlType, rows: usize, cols: usize, seed: u64) -> Option<Vec<u8>> {
    let scales = block_scales(dtype)?;
    let (per_block, block_bytes) = dtype.block();
    let n_blocks = rows * cols / per_block;
    let scales: Vec<(usize, [u8; 2])> = scales
        .iter()
        .map(|&(at, v)| (at, half::f16::from_f32(v).to_le_bytes()))
        .collect();
    let mut data = vec![0u8; n_blocks * block_bytes];
    const CHUNK: usize = 1 << 12;
    data.par_chunks_mut(CHUNK * block_bytes)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut state = seed ^ (i as u64).wrapping_mul(0xD134_2543_DE82_EF95);
            for q in chunk.chunks_mut(8) {
                let r = splitmix(&mut state).to_le_bytes();
                q.copy_from_slice(&r[..q.len()]);
            }
            for block in chunk.chunks_exact_mut(block_bytes) {
                for (at, bytes) in &scales {
                    block[*at..*at + 2].copy_from_slice(bytes);
                }
            }
        });
    Some(data)
}

/// SplitMix64: a fast, well-mixed stream per chunk (random weights for an 8B model are
/// billions of values).
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn name_hash(w: WeightName) -> u64 {
    // FNV-1a over the weight's name.
    format!("{w:?}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        })
}

impl WeightSource for DummyWeights {
    fn source_name(&self) -> String {
        "dummy weights".into()
    }

    fn tensor_name(&self, w: WeightName) -> String {
        format!("{w:?}")
    }

    fn contains(&self, w: WeightName) -> bool {
        match w {
            WeightName::LmHead => !self.config.tie_word_embeddings,
            WeightName::Layer(_, LayerWeight::QBias | LayerWeight::KBias | LayerWeight::VBias) => {
                self.config.attention_bias
            }
            _ => true,
        }
    }

    fn load_packed_raw(&self, w: WeightName) -> Result<Option<PackedTensor>> {
        // Routers stay f32, as llama.cpp's quantizer leaves them.
        let router = matches!(w, WeightName::Layer(_, LayerWeight::Router));
        let Some(dtype) = self.packed.filter(|_| !w.is_vector() && !router) else {
            return Ok(None);
        };
        let shape = w.expected_shape(&self.config);
        // Rows of every expert of a 3-D expert tensor.
        let cols = shape.last().copied().unwrap_or(1).max(1);
        let rows = shape.iter().product::<usize>() / cols;
        if !cols.is_multiple_of(dtype.block().0) {
            // Rows that are not whole blocks stay f32.
            return Ok(None);
        }
        let Some(data) = random_blocks(dtype, rows, cols, self.seed ^ name_hash(w)) else {
            return Ok(None);
        };
        Ok(Some(PackedTensor {
            data: data.into(),
            shape,
            dtype,
        }))
    }

    fn load_raw(&self, w: WeightName) -> Result<HostTensor> {
        let shape = w.expected_shape(&self.config);
        let n: usize = shape.iter().product();
        if w.is_norm() {
            return Ok(HostTensor::new(shape, vec![1.0; n]));
        }
        const CHUNK: usize = 1 << 16;
        let base = self.seed ^ name_hash(w);
        let mut data = vec![0f32; n];
        data.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, chunk)| {
                let mut state = base ^ (i as u64).wrapping_mul(0xD134_2543_DE82_EF95);
                for x in chunk {
                    // 24 random bits → [-1, 1) → ±0.035.
                    let u = (splitmix(&mut state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                    *x = u * 0.035;
                }
            });
        Ok(HostTensor::new(shape, data))
    }
}

/// The config (and tokenizer, when one comes with it) behind `spec` for dummy weights: a
/// `config.json` file, an HF directory or hub id, or a GGUF file (its weights are not read).
pub fn open_dummy_config(spec: &str) -> Result<(ModelConfig, Option<Tokenizer>)> {
    let path = Path::new(spec);
    if path.is_file() && path.extension().is_some_and(|e| e == "json") {
        let config = parse_hf_config(path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        return Ok((config, hf_tokenizer(dir)?));
    }
    match resolve(spec)? {
        ModelLocation::Gguf(p) => {
            let gguf = GgufFile::open(&p)?;
            let (config, tokenizer) = gguf.read_model()?;
            Ok((config, Some(tokenizer)))
        }
        ModelLocation::HfDir(dir) => {
            let config = parse_hf_config(&dir.join("config.json"))?;
            Ok((config, hf_tokenizer(&dir)?))
        }
    }
}

/// The tokenizer files of HF directory `dir`, or `None` where it has no tokenizer.json.
pub(crate) fn hf_tokenizer(dir: &Path) -> Result<Option<Tokenizer>> {
    if !dir.join("tokenizer.json").is_file() {
        return Ok(None);
    }
    Tokenizer::from_hf_dir(dir, &[])
        .map(Some)
        .map_err(|e| match e {
            InferError::Tokenizer(m) => InferError::Tokenizer(format!("{}: {m}", dir.display())),
            other => other,
        })
}
