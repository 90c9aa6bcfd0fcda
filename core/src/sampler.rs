//! Token sampling: greedy (temperature 0) or softmax sampling at a temperature, seeded.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{InferError, Result};

/// Index of the largest logit; ties go to the lowest index (as torch.argmax and numpy do).
/// NaN logits are never picked unless all are NaN.
pub fn argmax(logits: &[f32]) -> u32 {
    // Two passes that vectorize: the maximum over 16 independent lanes, then its first index
    // (a single compare-and-branch loop runs several times slower on a 49k vocabulary).
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
        }
    }
    let max = tail
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    logits.iter().position(|&x| x == max).unwrap_or(0) as u32
}

pub struct Sampler {
    temperature: f32,
    rng: StdRng,
}

impl Sampler {
    pub fn new(temperature: f32, seed: Option<u64>) -> Result<Self> {
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(InferError::invalid(
                "temperature",
                format!("{temperature} must be a finite number >= 0"),
            ));
        }
        let rng = match seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Ok(Sampler { temperature, rng })
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.temperature == 0.0 {
            return argmax(logits);
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv_t = 1.0 / self.temperature as f64;
        let weights: Vec<f64> = logits
            .iter()
            .map(|&l| ((l - max) as f64 * inv_t).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return i as u32;
            }
            r -= w;
        }
        argmax(logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_temperature_is_argmax_with_lowest_tie() {
        let mut s = Sampler::new(0.0, Some(1)).unwrap();
        assert_eq!(s.sample(&[0.0, 3.0, 3.0, -1.0]), 1);
        // Long rows (the vectorized path), ties across lanes, NaN and a tail.
        let mut row: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32).collect();
        row[5] = f32::NAN;
        assert_eq!(
            argmax(&row),
            (0..1000).find(|i| (i * 37) % 101 == 100).unwrap() as u32
        );
        row[999] = 500.0;
        assert_eq!(argmax(&row), 999);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
    }

    #[test]
    fn sampling_follows_softmax() {
        let mut s = Sampler::new(1.0, Some(7)).unwrap();
        let logits = [0.0f32, (3.0f32).ln()]; // p = 1/4, 3/4
        let n = 20000;
        let ones = (0..n).filter(|_| s.sample(&logits) == 1).count() as f64 / n as f64;
        assert!((ones - 0.75).abs() < 0.015, "{ones}");
    }

    #[test]
    fn same_seed_same_draws_and_bad_temperature_rejected() {
        let logits = [0.1f32, 0.2, 0.3, 0.4];
        let draw = |seed| {
            let mut s = Sampler::new(0.8, Some(seed)).unwrap();
            (0..32).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert!(Sampler::new(-1.0, None).is_err());
        assert!(Sampler::new(f32::NAN, None).is_err());
    }
}
