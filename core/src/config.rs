//! One `ModelConfig` for the Llama family, whichever file format it came from.

use crate::error::{InferError, Result};

/// How RoPE pairs up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions (2i, 2i+1) rotate together. GGUF files of arch `llama` store Q/K rows permuted
    /// for this layout (llama.cpp's convert step), so we keep their weights as they are.
    AdjacentPairs,
    /// Dimensions (i, i + d/2) rotate together ("rotate half", GPT-NeoX): HF checkpoints and
    /// GGUF files of arch `qwen2`.
    HalfSplit,
}

/// Frequency scaling applied to the rotary inverse frequencies.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (linear interpolation).
    Linear { factor: f64 },
    /// Llama 3.1's piecewise scaling of the inverse frequencies.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// Per-dimension divisors, as GGUF stores Llama 3.1 scaling (`rope_freqs.weight`).
    FreqFactors(Vec<f32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub rope_style: RopeStyle,
    /// Longest context the model was trained for.
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Q/K/V projections carry a bias (Qwen2).
    pub attention_bias: bool,
}

impl ModelConfig {
    /// Checks the invariants the forward relies on, so a bad file fails here and not in a kernel.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(InferError::Config(m));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return bad(format!("{name} is 0"));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "num_heads {} is not a multiple of num_kv_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {} is odd; RoPE needs pairs",
                self.head_dim
            ));
        }
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            return bad(format!("rope_theta {} must be positive", self.rope_theta));
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps < 0.0 {
            return bad(format!("rms_norm_eps {} must be >= 0", self.rms_norm_eps));
        }
        if let Some(RopeScaling::FreqFactors(f)) = &self.rope_scaling {
            if f.len() != self.head_dim / 2 {
                return bad(format!(
                    "rope_freqs has {} entries, expected head_dim/2 = {}",
                    f.len(),
                    self.head_dim / 2
                ));
            }
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Rotary inverse frequencies (float64), scaling applied.
    pub fn rope_inv_freq(&self) -> Vec<f64> {
        let half = self.head_dim / 2;
        let mut inv: Vec<f64> = (0..half)
            .map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / self.head_dim as f64))
            .collect();
        match &self.rope_scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => inv.iter_mut().for_each(|f| *f /= factor),
            Some(RopeScaling::FreqFactors(factors)) => {
                for (f, d) in inv.iter_mut().zip(factors) {
                    *f /= *d as f64;
                }
            }
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_ctx,
            }) => {
                let low_wavelen = old_ctx / low_freq_factor;
                let high_wavelen = old_ctx / high_freq_factor;
                for f in inv.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (old_ctx / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
        inv
    }

    /// cos/sin table `[max_len, head_dim]`: the first half of each row holds cos, the second sin,
    /// one entry per rotated pair. Computed in float64 so long positions stay accurate.
    pub fn rope_cos_sin(&self, max_len: usize) -> Vec<f32> {
        let inv = self.rope_inv_freq();
        let half = inv.len();
        let mut table = vec![0f32; max_len * 2 * half];
        for (pos, row) in table.chunks_exact_mut(2 * half).enumerate() {
            for (i, f) in inv.iter().enumerate() {
                let angle = pos as f64 * f;
                row[i] = angle.cos() as f32;
                row[half + i] = angle.sin() as f32;
            }
        }
        table
    }
}

/// The shapes unit tests need: a one-layer Llama of `heads` query heads (`kv_heads` KV heads)
/// of `head_dim`, MLP width `ff`, a 64-token vocabulary.
#[cfg(test)]
impl ModelConfig {
    pub(crate) fn test_llama(heads: usize, kv_heads: usize, head_dim: usize, ff: usize) -> Self {
        ModelConfig {
            architecture: "llama".into(),
            vocab_size: 64,
            hidden_size: heads * head_dim,
            intermediate_size: ff,
            num_layers: 1,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: None,
            rope_style: RopeStyle::HalfSplit,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
            attention_bias: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn tiny() -> ModelConfig {
        ModelConfig {
            vocab_size: 32,
            num_layers: 2,
            ..ModelConfig::test_llama(4, 2, 4, 24)
        }
    }

    #[test]
    fn validate_rejects_bad_gqa() {
        let mut c = tiny();
        c.num_kv_heads = 3;
        assert!(matches!(c.validate(), Err(InferError::Config(m)) if m.contains("multiple")));
    }

    #[test]
    fn llama3_scaling_keeps_high_freqs_and_divides_low_ones() {
        let mut c = tiny();
        c.head_dim = 128;
        c.rope_theta = 500000.0;
        let plain = c.rope_inv_freq();
        c.rope_scaling = Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        });
        let scaled = c.rope_inv_freq();
        assert_eq!(plain[0], scaled[0]);
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 8.0).abs() < 1e-18);
    }

    #[test]
    fn cos_sin_table_starts_at_identity() {
        let c = tiny();
        let t = c.rope_cos_sin(3);
        assert_eq!(&t[..4], &[1.0, 1.0, 0.0, 0.0]);
        assert!((t[4] - 1f64.cos() as f32).abs() < 1e-7);
    }
}
