//! `infer bench kernels --backend cpu`: the backend's matmul on quantized weights at a model's
//! shapes and batch sizes, as the forward calls it (`Backend::matmul`: activation quantization,
//! the level's kernels, the parallel tiles), timed on the wall clock, with the weight bytes read
//! per second and the multiply-adds' rate. Several copies of a matrix are cycled through where
//! one would sit in the cache, so decode-sized calls read the weights from memory as a model
//! larger than the cache does.

use std::time::Instant;

use infer_core::gguf::GgmlType;
use infer_core::{Backend, HostTensor, InferError, PackedTensor, Result};

use crate::qdot::Layout;
use crate::random::{random_packed, Rng};
use crate::tensor::Storage;
use crate::{CpuBackend, CpuTensor};

/// `out [m, n] = x [m, k] · wᵀ` for a `[n, k]` weight of `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulCase {
    pub dtype: GgmlType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// One case's median time and the rates it implies.
#[derive(Debug, Clone)]
pub struct MatmulTiming {
    pub case: MatmulCase,
    /// How the backend holds the weight: "interleaved", "as stored" or "f32".
    pub layout: &'static str,
    /// Matrices cycled through (each call reads the next).
    pub copies: usize,
    pub median_us: f64,
    /// 2·m·n·k operations per second, in billions.
    pub gops: f64,
    /// The weight's bytes as stored in the file, read per second (GB/s).
    pub gbytes_per_s: f64,
}

/// Times cases on one backend (its weight mode and the kernel level in use).
pub struct MatmulBench {
    backend: CpuBackend,
    /// Calls per timed sample.
    reps: usize,
    /// Timed samples per case (the median is reported).
    samples: usize,
    /// Bytes of copies to cycle through: at least this much weight data is read between two
    /// reads of the same matrix (0: one matrix).
    footprint: usize,
}

/// The most copies of one matrix `MatmulBench` makes (a tiny matrix under a large footprint).
const MAX_COPIES: usize = 4096;

impl MatmulBench {
    pub fn new(backend: CpuBackend, reps: usize, samples: usize, footprint: usize) -> Self {
        MatmulBench {
            backend,
            reps: reps.max(1),
            samples: samples.max(1),
            footprint,
        }
    }

    /// The median of `samples` timings of `reps` calls each, after one untimed pass over the
    /// copies.
    pub fn time(&self, case: &MatmulCase) -> Result<MatmulTiming> {
        let MatmulCase { dtype, m, n, k } = *case;
        let (per_block, _) = dtype.block();
        if !dtype.is_quantized() || m == 0 || n == 0 || k == 0 || !k.is_multiple_of(per_block) {
            return Err(InferError::Config(format!(
                "bench: {} [{n}, {k}] with {m} rows: a quantized type whose rows are whole \
                 blocks of {per_block}, and no empty side",
                dtype.name()
            )));
        }
        let mut rng = Rng(0x5eed ^ (n * 31 + k) as u64);
        let bytes = random_packed(dtype, n, k, &mut rng);
        let copies = self.footprint.div_ceil(bytes.len()).clamp(1, MAX_COPIES);
        let weights = (0..copies)
            .map(|_| self.upload(dtype, n, k, bytes.clone()))
            .collect::<Result<Vec<_>>>()?;
        let x: Vec<f32> = (0..m * k).map(|_| rng.uniform()).collect();
        let x = self.backend.upload(&HostTensor::new(vec![m, k], x))?;
        for w in &weights {
            self.backend.matmul(&x, w)?;
        }
        let mut times = Vec::with_capacity(self.samples);
        let mut next = 0;
        for _ in 0..self.samples {
            let start = Instant::now();
            for _ in 0..self.reps {
                self.backend.matmul(&x, &weights[next])?;
                next = (next + 1) % copies;
            }
            times.push(start.elapsed().as_secs_f64() / self.reps as f64);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        Ok(MatmulTiming {
            case: *case,
            layout: layout_name(&weights[0]),
            copies,
            median_us: median * 1e6,
            gops: 2.0 * (m * n * k) as f64 / median / 1e9,
            gbytes_per_s: bytes.len() as f64 / median / 1e9,
        })
    }

    /// The weight as the model loader hands it over: packed where the backend keeps it so,
    /// else dequantized.
    fn upload(&self, dtype: GgmlType, n: usize, k: usize, bytes: Vec<u8>) -> Result<CpuTensor> {
        let packed = PackedTensor {
            shape: vec![n, k],
            dtype,
            data: bytes.into(),
        };
        if let Some(t) = self.backend.upload_packed(&packed)? {
            return Ok(t);
        }
        let mut values = vec![0f32; n * k];
        dtype.dequantize(&packed.data, &mut values);
        self.backend.upload(&HostTensor::new(vec![n, k], values))
    }
}

fn layout_name(w: &CpuTensor) -> &'static str {
    match &w.storage {
        Storage::F32(_) => "f32",
        Storage::Packed {
            layout: Layout::Interleaved,
            ..
        } => "interleaved",
        Storage::Packed { .. } => "as stored",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_every_weight_mode_and_refuses_bad_cases() {
        for backend in [
            CpuBackend::new(),
            CpuBackend::new().without_repacking(),
            CpuBackend::f32_weights(),
        ] {
            let bench = MatmulBench::new(backend, 2, 3, 64 << 10);
            let case = MatmulCase {
                dtype: GgmlType::Q4K,
                m: 3,
                n: 16,
                k: 256,
            };
            let t = bench.time(&case).unwrap();
            assert!(t.median_us > 0.0 && t.gops > 0.0 && t.gbytes_per_s > 0.0);
            // 16 rows of one 144-byte block: 29 copies make 64 KiB.
            assert_eq!(t.copies, 29);
        }
        let bench = MatmulBench::new(CpuBackend::new(), 1, 1, 0);
        for (dtype, k) in [(GgmlType::F32, 32), (GgmlType::Q4K, 100)] {
            let case = MatmulCase {
                dtype,
                m: 1,
                n: 8,
                k,
            };
            assert!(bench.time(&case).is_err(), "{case:?}");
        }
    }
}
