//! Format-independent access to model weights: the forward asks for canonical weights, each
//! file format maps them to its own tensor names and dequantizes to f32 on load.

use crate::config::ModelConfig;
use crate::error::{InferError, Result};
use crate::model::names::{Format, TensorLoc, TensorNames};

pub use crate::host_tensor::{HostTensor, PackedBytes, PackedTensor};
pub use crate::model::weight_name::{LayerWeight, WeightName};

/// Where weights come from (a model file through its family's names, random values).
pub trait WeightSource: Send + Sync {
    /// Names the source in error messages (usually a path).
    fn source_name(&self) -> String;
    /// The name this source uses for a canonical weight.
    fn tensor_name(&self, w: WeightName) -> String;
    fn contains(&self, w: WeightName) -> bool;
    /// Loads and dequantizes one weight to f32, shape as stored (row-major).
    fn load_raw(&self, w: WeightName) -> Result<HostTensor>;

    /// The weight's blocks as stored, when it is block-quantized; `None` otherwise.
    fn load_packed_raw(&self, _w: WeightName) -> Result<Option<PackedTensor>> {
        Ok(None)
    }

    /// Loads a weight and checks its shape against the config.
    fn load(&self, w: WeightName, config: &ModelConfig) -> Result<HostTensor> {
        self.check_present(w)?;
        let t = self.load_raw(w)?;
        self.check_shape(w, config, &t.shape)?;
        Ok(t)
    }

    /// Like `load`, but keeps block-quantized weights packed (`None` for other types).
    fn load_packed(&self, w: WeightName, config: &ModelConfig) -> Result<Option<PackedTensor>> {
        self.check_present(w)?;
        let packed = self.load_packed_raw(w)?;
        if let Some(p) = &packed {
            self.check_shape(w, config, &p.shape)?;
        }
        Ok(packed)
    }

    fn check_present(&self, w: WeightName) -> Result<()> {
        if self.contains(w) {
            return Ok(());
        }
        Err(InferError::MissingTensor {
            name: self.tensor_name(w),
            source_name: self.source_name(),
        })
    }

    fn check_shape(&self, w: WeightName, config: &ModelConfig, shape: &[usize]) -> Result<()> {
        let expected = w.expected_shape(config);
        if shape != expected {
            return Err(InferError::ShapeMismatch {
                name: self.tensor_name(w),
                expected,
                actual: shape.to_vec(),
            });
        }
        Ok(())
    }
}

/// A model file's tensors under the file's own names (a GGUF file, safetensors shards).
pub trait TensorStore: Send + Sync {
    fn source_name(&self) -> String;
    fn format(&self) -> Format;
    fn has(&self, name: &str) -> bool;
    /// The tensor dequantized to f32, shape as stored (row-major).
    fn read(&self, name: &str) -> Result<HostTensor>;
    /// The tensor's blocks as stored, when it is a block-quantized matrix.
    fn read_packed(&self, _name: &str) -> Result<Option<PackedTensor>> {
        Ok(None)
    }
}

/// A model file read through its family's tensor names: fused projections are cut into
/// their rows, and stored norm weights get the family's offset.
pub struct ModelWeights<S> {
    pub store: S,
    names: &'static TensorNames,
    config: ModelConfig,
}

impl<S: TensorStore> ModelWeights<S> {
    pub fn new(store: S, config: &ModelConfig) -> Self {
        ModelWeights {
            store,
            names: &config.family.spec().names,
            config: config.clone(),
        }
    }

    /// Where `w` lives in the file (its tensor name, and rows of a fused one).
    pub fn locate(&self, w: WeightName) -> TensorLoc {
        self.names.locate(self.store.format(), &self.config, w)
    }

    /// Experts `0..n`, each its own tensor of one shape, stacked along a new first dimension.
    fn load_stacked(&self, loc: &TensorLoc, n: usize) -> Result<HostTensor> {
        let mut shape = Vec::new();
        let mut data = Vec::new();
        for e in 0..n {
            let t = self.store.read(&loc.expert_name(e))?;
            if e == 0 {
                shape = t.shape.clone();
                data.reserve(n * t.data.len());
            } else if t.shape != shape {
                return Err(InferError::ShapeMismatch {
                    name: loc.expert_name(e),
                    expected: shape,
                    actual: t.shape,
                });
            }
            data.extend_from_slice(&t.data);
        }
        shape.insert(0, n);
        Ok(HostTensor::new(shape, data))
    }

    fn rows_error(&self, loc: &TensorLoc, shape: &[usize]) -> InferError {
        InferError::ShapeMismatch {
            name: loc.name.clone(),
            expected: vec![
                loc.rows.as_ref().map_or(0, |r| r.end),
                shape.get(1).copied().unwrap_or(0),
            ],
            actual: shape.to_vec(),
        }
    }
}

impl<S: TensorStore> WeightSource for ModelWeights<S> {
    fn source_name(&self) -> String {
        self.store.source_name()
    }

    fn tensor_name(&self, w: WeightName) -> String {
        let loc = self.locate(w);
        if let Some(n) = loc.stacked {
            return format!("{} (e in 0..{n})", loc.name);
        }
        match loc.rows {
            Some(r) => format!("{} (rows {}..{})", loc.name, r.start, r.end),
            None => loc.name,
        }
    }

    fn contains(&self, w: WeightName) -> bool {
        let loc = self.locate(w);
        match loc.stacked {
            Some(n) => (0..n).all(|e| self.store.has(&loc.expert_name(e))),
            None => self.store.has(&loc.name),
        }
    }

    fn load_raw(&self, w: WeightName) -> Result<HostTensor> {
        let loc = self.locate(w);
        if let Some(n) = loc.stacked {
            return self.load_stacked(&loc, n);
        }
        let mut t = self.store.read(&loc.name)?;
        if let Some(layout) = loc.layout {
            let shape = t.shape.clone();
            t = layout.apply(t).ok_or_else(|| InferError::ShapeMismatch {
                name: loc.name.clone(),
                expected: w.expected_shape(&self.config),
                actual: shape,
            })?;
        }
        if let Some(rows) = &loc.rows {
            let cols = match t.shape.as_slice() {
                [n, cols] if *n >= rows.end => *cols,
                _ => return Err(self.rows_error(&loc, &t.shape)),
            };
            t = HostTensor::new(
                vec![rows.len(), cols],
                t.data[rows.start * cols..rows.end * cols].to_vec(),
            );
        }
        let offset = self.config.features.norm_weight_offset;
        if offset != 0.0 && w.is_norm() {
            t.data.iter_mut().for_each(|x| *x += offset);
        }
        Ok(t)
    }

    fn load_packed_raw(&self, w: WeightName) -> Result<Option<PackedTensor>> {
        let loc = self.locate(w);
        if loc.stacked.is_some() || loc.layout.is_some() {
            // Per-expert and re-laid-out tensors come from safetensors, never block-quantized.
            return Ok(None);
        }
        let Some(p) = self.store.read_packed(&loc.name)? else {
            return Ok(None);
        };
        let Some(rows) = &loc.rows else {
            return Ok(Some(p));
        };
        if p.shape.len() != 2 || p.shape[0] < rows.end {
            return Err(self.rows_error(&loc, &p.shape));
        }
        // Whole rows of a packed matrix are whole blocks: a view of the same bytes.
        let row_bytes = p.row_bytes();
        Ok(Some(PackedTensor {
            shape: vec![rows.len(), p.shape[1]],
            dtype: p.dtype,
            data: p.data.slice(rows.start * row_bytes..rows.end * row_bytes),
        }))
    }
}

/// Converts between the two RoPE row layouts of Q/K weights, per head, as llama.cpp's
/// convert script does: HF "rotate half" rows → adjacent-pair rows (`to_adjacent = true`)
/// or back. `rows` is `[n_heads * head_dim, cols]`, or a bias when `cols == 1`.
pub fn permute_qk_rows(data: &[f32], n_heads: usize, cols: usize, to_adjacent: bool) -> Vec<f32> {
    let head_dim = data.len() / cols / n_heads;
    let half = head_dim / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_heads {
        for i in 0..half {
            for (r, adjacent) in [(0, 2 * i), (1, 2 * i + 1)] {
                // HF row `r * half + i` sits at adjacent-pair row `2i + r`.
                let hf = h * head_dim + r * half + i;
                let adj = h * head_dim + adjacent;
                let (src, dst) = if to_adjacent { (hf, adj) } else { (adj, hf) };
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_round_trips_and_interleaves_halves() {
        let data: Vec<f32> = (0..16).map(|x| x as f32).collect(); // 2 heads × 4 rows × 2 cols
        let adj = permute_qk_rows(&data, 2, 2, true);
        // head 0 HF rows [0,1,2,3] (halves [0,1] and [2,3]) become [0,2,1,3]
        assert_eq!(&adj[..8], &[0., 1., 4., 5., 2., 3., 6., 7.]);
        assert_eq!(permute_qk_rows(&adj, 2, 2, false), data);
    }
}
