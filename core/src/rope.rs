//! Rotary position embeddings: the inverse frequencies of every scaling users meet (linear,
//! Llama 3.1, YaRN, LongRoPE, GGUF's per-dimension factors), and the cos/sin table the `rope`
//! op reads. Computed in float64, as transformers does in float32 from float64 constants;
//! formulas follow `transformers.modeling_rope_utils`.

use crate::error::{InferError, Result};
use crate::narrow::f32_of;

/// How RoPE pairs up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions (2i, 2i+1) rotate together. GGUF files of arch `llama` (and `granite`) store
    /// Q/K rows permuted for this layout (llama.cpp's convert step), so we keep their weights
    /// as they are.
    AdjacentPairs,
    /// Dimensions (i, i + r/2) rotate together ("rotate half", GPT-NeoX): HF checkpoints and
    /// every other GGUF architecture.
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
    /// YaRN: interpolated low frequencies, extrapolated high ones, a linear ramp between, and
    /// cos/sin scaled by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        /// Round the ramp's ends to whole dimensions (transformers' default).
        truncate: bool,
    },
    /// LongRoPE (Phi-3/Phi-4): per-dimension divisors, the long set for contexts past
    /// `original_max_position_embeddings` and the short set within it, cos/sin scaled by
    /// `attention_factor`. The set is chosen once from the served context (`max_model_len`),
    /// as llama.cpp does, so results never depend on what else is in the batch.
    LongRope {
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        original_max_position_embeddings: usize,
        attention_factor: f64,
    },
}

/// YaRN's attention scale for a context stretch `scale` (transformers' `get_mscale`).
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// LongRoPE's default attention scale for a context stretch `factor`.
pub fn longrope_attention_factor(factor: f64, original: usize) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / (original as f64).ln()).sqrt()
    }
}

/// The rotary embedding of one kind of layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: Option<RopeScaling>,
    /// Dimensions of each head that rotate (`partial_rotary_factor × head_dim`), even; the
    /// rest pass through.
    pub rotary_dim: usize,
}

impl Rope {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(InferError::Config(m));
        if self.theta.is_nan() || self.theta <= 0.0 {
            return bad(format!("rope_theta {} must be positive", self.theta));
        }
        if self.rotary_dim == 0 || !self.rotary_dim.is_multiple_of(2) {
            return bad(format!(
                "rotary dimension {} must be even and > 0",
                self.rotary_dim
            ));
        }
        let half = self.rotary_dim / 2;
        let factor_ok = |f: f64| f.is_finite() && f > 0.0;
        match &self.scaling {
            None => Ok(()),
            Some(RopeScaling::FreqFactors(f)) if f.len() != half => bad(format!(
                "rope_freqs has {} entries, expected rotary_dim/2 = {half}",
                f.len()
            )),
            Some(RopeScaling::LongRope {
                short_factor,
                long_factor,
                ..
            }) if short_factor.len() != half || long_factor.len() != half => bad(format!(
                "longrope factors have {} and {} entries, expected rotary_dim/2 = {half}",
                short_factor.len(),
                long_factor.len()
            )),
            Some(RopeScaling::Linear { factor } | RopeScaling::Yarn { factor, .. })
                if !factor_ok(*factor) =>
            {
                bad(format!("rope scaling factor {factor} must be positive"))
            }
            Some(RopeScaling::Llama3 {
                low_freq_factor,
                high_freq_factor,
                ..
            }) if low_freq_factor >= high_freq_factor => bad(format!(
                "llama3 rope scaling: low_freq_factor {low_freq_factor} must be below high_freq_factor {high_freq_factor}"
            )),
            _ => Ok(()),
        }
    }

    fn base_inv_freq(&self) -> Vec<f64> {
        let d = self.rotary_dim as f64;
        (0..self.rotary_dim / 2)
            .map(|i| 1.0 / self.theta.powf(2.0 * i as f64 / d))
            .collect()
    }

    /// Inverse frequencies (float64) with the scaling applied, and the factor cos and sin are
    /// multiplied by, for a context of `max_len` positions.
    pub fn inv_freq(&self, max_len: usize) -> (Vec<f64>, f64) {
        let mut inv = self.base_inv_freq();
        let mut attention = 1.0;
        match &self.scaling {
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
            Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: old_ctx,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            }) => {
                let d = self.rotary_dim as f64;
                let base = self.theta;
                let correction_dim = |rotations: f64| {
                    d * (old_ctx / (rotations * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * base.ln())
                };
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                if low == high {
                    high += 0.001;
                }
                for (i, f) in inv.iter_mut().enumerate() {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    *f = *f / factor * (1.0 - extrapolation) + *f * extrapolation;
                }
                attention = *attention_factor;
            }
            Some(RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor,
            }) => {
                let ext = if max_len > *original_max_position_embeddings {
                    long_factor
                } else {
                    short_factor
                };
                for (f, e) in inv.iter_mut().zip(ext) {
                    *f /= e;
                }
                attention = *attention_factor;
            }
        }
        (inv, attention)
    }

    /// cos/sin table `[max_len, rotary_dim]`: the first half of each row holds cos, the second
    /// sin, one entry per rotated pair. Computed in float64 so long positions stay accurate.
    pub fn cos_sin(&self, max_len: usize) -> Vec<f32> {
        let (inv, attention) = self.inv_freq(max_len);
        let half = inv.len();
        let mut table = vec![0f32; max_len * 2 * half];
        for (pos, row) in table.chunks_exact_mut(2 * half).enumerate() {
            for (i, f) in inv.iter().enumerate() {
                let angle = pos as f64 * f;
                row[i] = f32_of(angle.cos() * attention);
                row[half + i] = f32_of(angle.sin() * attention);
            }
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(scaling: Option<RopeScaling>) -> Rope {
        Rope {
            theta: 500000.0,
            scaling,
            rotary_dim: 128,
        }
    }

    #[test]
    fn llama3_scaling_keeps_high_freqs_and_divides_low_ones() {
        let (plain, _) = rope(None).inv_freq(8);
        let (scaled, _) = rope(Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        }))
        .inv_freq(8);
        assert_eq!(plain[0], scaled[0]);
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 8.0).abs() < 1e-18);
    }

    #[test]
    fn yarn_extrapolates_high_and_interpolates_low_frequencies() {
        let r = rope(Some(RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: yarn_mscale(4.0, 1.0),
            truncate: true,
        }));
        let (plain, _) = rope(None).inv_freq(8);
        let (scaled, att) = r.inv_freq(8);
        assert_eq!(plain[0], scaled[0]);
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 4.0).abs() < 1e-18);
        assert!((att - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
        assert!(
            r.cos_sin(1)[0] > 1.0,
            "cos at position 0 carries the attention factor"
        );
    }

    #[test]
    fn longrope_picks_its_factor_set_by_context() {
        let r = Rope {
            theta: 10000.0,
            scaling: Some(RopeScaling::LongRope {
                short_factor: vec![1.0, 2.0],
                long_factor: vec![3.0, 4.0],
                original_max_position_embeddings: 16,
                attention_factor: 1.5,
            }),
            rotary_dim: 4,
        };
        let (short, a) = r.inv_freq(16);
        let (long, _) = r.inv_freq(17);
        assert_eq!(short, vec![1.0, 0.01 / 2.0]);
        assert_eq!(long, vec![1.0 / 3.0, 0.01 / 4.0]);
        assert_eq!(a, 1.5);
    }

    #[test]
    fn cos_sin_table_starts_at_identity() {
        let r = Rope {
            theta: 10000.0,
            scaling: None,
            rotary_dim: 4,
        };
        let t = r.cos_sin(3);
        assert_eq!(&t[..4], &[1.0, 1.0, 0.0, 0.0]);
        assert!((t[4] - 1f64.cos() as f32).abs() < 1e-7);
    }
}
