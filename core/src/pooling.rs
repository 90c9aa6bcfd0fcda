//! Pooling: how a decoder run as an embedding model (vLLM's `--runner pooling`) turns a
//! prompt's final hidden states into one vector, and what a request may do to that vector.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{InferError, Result};
use crate::narrow::f32_of;

/// Which final-normed hidden states make a prompt's embedding (vLLM's `pooling_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PoolingType {
    /// The last token's: what causal embedders (Qwen3-Embedding, e5-mistral) are trained on,
    /// and vLLM's default for a decoder converted to an embedder.
    #[default]
    Last,
    /// The mean over every prompt token.
    Mean,
    /// The first token's.
    Cls,
}

impl PoolingType {
    pub const NAMES: &'static [&'static str] = &["LAST", "MEAN", "CLS"];
}

impl FromStr for PoolingType {
    type Err = InferError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_uppercase().as_str() {
            "LAST" => Ok(PoolingType::Last),
            "MEAN" => Ok(PoolingType::Mean),
            "CLS" => Ok(PoolingType::Cls),
            _ => Err(InferError::invalid(
                "pooling_type",
                format!(
                    "`{s}` is not one infer pools by (supported: {})",
                    Self::NAMES.join(", ")
                ),
            )),
        }
    }
}

impl fmt::Display for PoolingType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolingType::Last => "LAST",
            PoolingType::Mean => "MEAN",
            PoolingType::Cls => "CLS",
        })
    }
}

/// One embedding call's settings: the server's pooler plus the request's own choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbedParams {
    pub pooling: PoolingType,
    /// Scale each vector to unit L2 norm (after `dimensions` cuts it).
    pub normalize: bool,
    /// Keep only the first this many components (OpenAI's `dimensions`, Matryoshka style).
    pub dimensions: Option<usize>,
}

impl Default for EmbedParams {
    fn default() -> Self {
        EmbedParams {
            pooling: PoolingType::Last,
            normalize: true,
            dimensions: None,
        }
    }
}

impl EmbedParams {
    /// Checks `dimensions` against the model's hidden size.
    pub fn check(&self, hidden_size: usize) -> Result<()> {
        match self.dimensions {
            Some(d) if d == 0 || d > hidden_size => Err(InferError::invalid(
                "dimensions",
                format!("{d} is not between 1 and the model's hidden size {hidden_size}"),
            )),
            _ => Ok(()),
        }
    }

    /// The embedding of a pooled vector: cut to `dimensions`, then normalized if asked (a
    /// zero vector stays zero).
    pub fn finish(&self, mut pooled: Vec<f32>) -> Vec<f32> {
        if let Some(d) = self.dimensions {
            pooled.truncate(d);
        }
        if self.normalize {
            let norm = pooled
                .iter()
                .map(|&x| f64::from(x) * f64::from(x))
                .sum::<f64>()
                .sqrt();
            if norm > 0.0 {
                for x in &mut pooled {
                    *x = f32_of(f64::from(*x) / norm);
                }
            }
        }
        pooled
    }
}

/// One prompt's pooled state while its chunks run.
#[derive(Debug, Clone, Default)]
pub(crate) struct PooledRows {
    sum: Vec<f64>,
    rows: usize,
}

impl PooledRows {
    /// Adds a hidden row (mean pooling adds every row; last and first pooling take one).
    pub fn add(&mut self, row: &[f32]) {
        if self.sum.is_empty() {
            self.sum = vec![0.0; row.len()];
        }
        for (s, &x) in self.sum.iter_mut().zip(row) {
            *s += f64::from(x);
        }
        self.rows += 1;
    }

    /// The mean of the rows added.
    pub fn mean(&self) -> Vec<f32> {
        let n = self.rows.max(1) as f64;
        self.sum.iter().map(|&s| f32_of(s / n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_names_parse_in_any_case() {
        assert_eq!("mean".parse::<PoolingType>().unwrap(), PoolingType::Mean);
        assert_eq!("LAST".parse::<PoolingType>().unwrap(), PoolingType::Last);
        assert_eq!("Cls".parse::<PoolingType>().unwrap(), PoolingType::Cls);
        let e = "step".parse::<PoolingType>().unwrap_err().to_string();
        assert!(e.contains("pooling_type") && e.contains("MEAN"), "{e}");
    }

    #[test]
    fn dimensions_cut_before_normalizing() {
        let p = EmbedParams {
            pooling: PoolingType::Mean,
            normalize: true,
            dimensions: Some(2),
        };
        assert_eq!(p.finish(vec![3.0, 4.0, 100.0]), [0.6, 0.8]);
        let raw = EmbedParams {
            normalize: false,
            ..p
        };
        assert_eq!(raw.finish(vec![3.0, 4.0, 100.0]), [3.0, 4.0]);
        assert!(p.check(2).is_ok());
        assert!(p.check(1).is_err());
        let zero = EmbedParams {
            dimensions: Some(0),
            ..p
        };
        assert!(zero.check(8).is_err());
    }

    #[test]
    fn mean_of_rows() {
        let mut r = PooledRows::default();
        r.add(&[1.0, 2.0]);
        r.add(&[3.0, 6.0]);
        assert_eq!(r.mean(), [2.0, 4.0]);
    }
}
