//! A rank's slice of each weight: q/k/v (and their biases) and gate/up by output rows (heads,
//! MLP columns), o_proj and down_proj by input columns; norms, embedding and lm_head whole.
//! Quantized weights are cut on block boundaries: whole rows are a view of the same bytes,
//! columns are whole blocks of every row; a column cut inside a block is dequantized first.

use super::TensorParallel;
use crate::config::ModelConfig;
use crate::weights::{HostTensor, LayerWeight, PackedTensor, WeightName};

/// Which part of a weight a rank holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    Whole,
    /// Output rows `start..start + len` (the first dimension; elements of a bias).
    Rows {
        start: usize,
        len: usize,
    },
    /// Rows `start..start + len` of each expert's matrix (expert gate and up).
    ExpertRows {
        start: usize,
        len: usize,
    },
    /// Input columns `start..start + len` of every row (of every expert's matrix).
    Cols {
        start: usize,
        len: usize,
    },
}

fn split(tp: &TensorParallel, c: &ModelConfig, w: WeightName) -> Split {
    if !tp.is_parallel() {
        return Split::Whole;
    }
    let q_len = c.num_heads / tp.size * c.head_dim;
    let kv_len = tp.local_kv_heads(c) * c.head_dim;
    let kv_start = tp.first_kv_head(c) * c.head_dim;
    let ff_len = c.intermediate_size / tp.size;
    let eff_len = c
        .features
        .moe
        .as_ref()
        .map_or(0, |m| m.expert_intermediate_size / tp.size);
    let WeightName::Layer(_, w) = w else {
        return Split::Whole;
    };
    match w {
        LayerWeight::Q | LayerWeight::QBias => Split::Rows {
            start: tp.rank * q_len,
            len: q_len,
        },
        LayerWeight::K | LayerWeight::V | LayerWeight::KBias | LayerWeight::VBias => Split::Rows {
            start: kv_start,
            len: kv_len,
        },
        LayerWeight::Gate | LayerWeight::Up => Split::Rows {
            start: tp.rank * ff_len,
            len: ff_len,
        },
        LayerWeight::O => Split::Cols {
            start: tp.rank * q_len,
            len: q_len,
        },
        LayerWeight::Down => Split::Cols {
            start: tp.rank * ff_len,
            len: ff_len,
        },
        // Experts split along their intermediate dimension; every rank routes alike.
        LayerWeight::ExpGate | LayerWeight::ExpUp => Split::ExpertRows {
            start: tp.rank * eff_len,
            len: eff_len,
        },
        LayerWeight::ExpDown => Split::Cols {
            start: tp.rank * eff_len,
            len: eff_len,
        },
        LayerWeight::ExpGateBias | LayerWeight::ExpUpBias => Split::Cols {
            start: tp.rank * eff_len,
            len: eff_len,
        },
        LayerWeight::Sinks => Split::Rows {
            start: tp.rank * (c.num_heads / tp.size),
            len: c.num_heads / tp.size,
        },
        // Replicated; the down and o_proj biases are added on rank 0 only.
        LayerWeight::Router
        | LayerWeight::RouterBias
        | LayerWeight::ExpDownBias
        | LayerWeight::OBias => Split::Whole,
        // Norms act on whole hidden rows, or on each head alike (per-head q/k norms).
        LayerWeight::AttnNorm
        | LayerWeight::FfnNorm
        | LayerWeight::PostAttnNorm
        | LayerWeight::PostFfnNorm
        | LayerWeight::QNorm
        | LayerWeight::KNorm => Split::Whole,
    }
}

/// This rank's part of a dense weight of the full model's shape.
pub fn shard_weight(
    tp: &TensorParallel,
    c: &ModelConfig,
    w: WeightName,
    t: HostTensor,
) -> HostTensor {
    let cols = if t.shape.len() >= 2 {
        t.shape[t.shape.len() - 1]
    } else {
        1
    };
    let mut shape = t.shape.clone();
    match split(tp, c, w) {
        Split::Whole => t,
        Split::Rows { start, len } => {
            shape[0] = len;
            HostTensor::new(shape, t.data[start * cols..(start + len) * cols].to_vec())
        }
        Split::ExpertRows { start, len } => {
            // [experts, rows, cols]: the same rows of every expert.
            let (experts, rows) = (shape[0], shape[1]);
            shape[1] = len;
            let data = (0..experts)
                .flat_map(|e| {
                    let first = (e * rows + start) * cols;
                    &t.data[first..first + len * cols]
                })
                .copied()
                .collect();
            HostTensor::new(shape, data)
        }
        Split::Cols { start, len } => {
            let rows = t.data.len() / cols.max(1);
            let data = (0..rows)
                .flat_map(|r| &t.data[r * cols + start..r * cols + start + len])
                .copied()
                .collect();
            if let Some(last) = shape.last_mut() {
                *last = len;
            }
            HostTensor::new(shape, data)
        }
    }
}

/// This rank's part of a block-quantized weight, still packed; `None` when its columns do not
/// start and end on block boundaries (the caller dequantizes and uses `shard_weight`).
pub fn shard_packed(
    tp: &TensorParallel,
    c: &ModelConfig,
    w: WeightName,
    p: PackedTensor,
) -> Option<PackedTensor> {
    let row_bytes = p.row_bytes();
    let (per_block, block_bytes) = p.dtype.block();
    let mut shape = p.shape.clone();
    match split(tp, c, w) {
        Split::Whole => Some(p),
        Split::Rows { start, len } => {
            shape[0] = len;
            Some(PackedTensor {
                shape,
                dtype: p.dtype,
                data: p.data.slice(start * row_bytes..(start + len) * row_bytes),
            })
        }
        Split::ExpertRows { start, len } => {
            let (experts, rows) = (shape[0], shape[1]);
            shape[1] = len;
            let mut data = Vec::with_capacity(experts * len * row_bytes);
            for e in 0..experts {
                let first = (e * rows + start) * row_bytes;
                data.extend_from_slice(&p.data[first..first + len * row_bytes]);
            }
            Some(PackedTensor {
                shape,
                dtype: p.dtype,
                data: data.into(),
            })
        }
        Split::Cols { start, len } => {
            if !start.is_multiple_of(per_block) || !len.is_multiple_of(per_block) {
                return None;
            }
            let (from, n) = (
                start / per_block * block_bytes,
                len / per_block * block_bytes,
            );
            let rows = p.data.len() / row_bytes.max(1);
            let mut data = Vec::with_capacity(rows * n);
            for r in 0..rows {
                data.extend_from_slice(&p.data[r * row_bytes + from..r * row_bytes + from + n]);
            }
            if let Some(last) = shape.last_mut() {
                *last = len;
            }
            Some(PackedTensor {
                shape,
                dtype: p.dtype,
                data: data.into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;

    fn config() -> ModelConfig {
        ModelConfig::test_llama(4, 2, 16, 128)
    }

    fn q8_0(rows: usize, cols: usize, seed: u32) -> PackedTensor {
        let (per, bytes) = GgmlType::Q8_0.block();
        let n = rows * cols / per * bytes;
        // Scale 1.0 (f16 0x3C00), then int8 values varying with the position.
        let mut data = Vec::with_capacity(n);
        for b in 0..rows * cols / per {
            data.extend_from_slice(&[0x00, 0x3C]);
            data.extend((0..per).map(|i| ((b * 31 + i * 7 + seed as usize) % 200) as u8));
        }
        PackedTensor {
            shape: vec![rows, cols],
            dtype: GgmlType::Q8_0,
            data: data.into(),
        }
    }

    #[test]
    fn packed_slices_dequantize_to_the_dense_slices() {
        let c = config();
        for size in [2, 4] {
            for rank in 0..size {
                let tp = TensorParallel { rank, size };
                for (w, rows, cols) in [
                    (LayerWeight::Q, 64, 64),
                    (LayerWeight::K, 32, 64),
                    (LayerWeight::Gate, 128, 64),
                    (LayerWeight::O, 64, 64),
                    (LayerWeight::Down, 64, 128),
                ] {
                    let w = WeightName::Layer(0, w);
                    let p = q8_0(rows, cols, rank as u32);
                    let dense = shard_weight(&tp, &c, w, p.dequantize());
                    match shard_packed(&tp, &c, w, p) {
                        Some(packed) => {
                            assert_eq!(packed.dequantize(), dense, "{w:?} rank {rank}/{size}")
                        }
                        // o_proj at tp 4: 16 columns per rank, inside Q8_0's 32-wide blocks.
                        None => assert!(
                            size == 4 && w == WeightName::Layer(0, LayerWeight::O),
                            "{w:?} rank {rank}/{size} not packed"
                        ),
                    }
                    let local = tp.local_config(&c);
                    assert_eq!(dense.shape, w.expected_shape(&local), "{w:?}");
                }
            }
        }
    }

    #[test]
    fn experts_split_along_their_intermediate_dimension() {
        use crate::config::{Moe, MoeRouting, MoeScoring};
        let mut c = config();
        c.features.moe = Some(Moe {
            routing: MoeRouting {
                num_experts: 3,
                top_k: 2,
                scoring: MoeScoring::SoftmaxTopK { renormalize: true },
            },
            expert_intermediate_size: 64,
            sparse_layers: Vec::new(),
            biases: false,
        });
        for size in [1, 2] {
            for rank in 0..size {
                let tp = TensorParallel { rank, size };
                let local = tp.local_config(&c);
                for (w, shape) in [
                    (LayerWeight::ExpGate, [3, 64, 64]),
                    (LayerWeight::ExpDown, [3, 64, 64]),
                    (LayerWeight::Router, [3, 64, 64]),
                ] {
                    let w = WeightName::Layer(0, w);
                    let mut p = q8_0(3 * 64, 64, rank as u32);
                    p.shape = shape.to_vec();
                    let full = p.dequantize();
                    let dense = shard_weight(&tp, &c, w, full.clone());
                    let packed = shard_packed(&tp, &c, w, p).unwrap();
                    assert_eq!(packed.dequantize(), dense, "{w:?} rank {rank}/{size}");
                    if w == WeightName::Layer(0, LayerWeight::Router) {
                        assert_eq!(dense, full, "the router is replicated");
                        continue;
                    }
                    assert_eq!(dense.shape, w.expected_shape(&local), "{w:?}");
                    // Expert 2's first local element is the full tensor's at this rank's offset.
                    let (off_rows, off_cols) = match w {
                        WeightName::Layer(_, LayerWeight::ExpGate) => (rank * 64 / size, 0),
                        _ => (0, rank * 64 / size),
                    };
                    let at = |t: &HostTensor, e: usize, r: usize, col: usize| {
                        t.data[(e * t.shape[1] + r) * t.shape[2] + col]
                    };
                    assert_eq!(at(&dense, 2, 0, 0), at(&full, 2, off_rows, off_cols));
                }
            }
        }
    }

    #[test]
    fn columns_inside_a_block_are_left_to_the_dense_path() {
        let mut c = config();
        c.num_heads = 8;
        c.head_dim = 8; // o_proj columns per rank of 4: 16, not a multiple of Q8_0's 32
        let tp = TensorParallel { rank: 1, size: 4 };
        let w = WeightName::Layer(0, LayerWeight::O);
        assert!(shard_packed(&tp, &c, w, q8_0(64, 64, 0)).is_none());
    }

    #[test]
    fn replicated_kv_heads_go_to_the_ranks_whose_queries_read_them() {
        let c = config(); // 4 heads, 2 KV heads
        let k = HostTensor::new(vec![32, 1], (0..32).map(|x| x as f32).collect());
        let w = WeightName::Layer(0, LayerWeight::KBias);
        let heads: Vec<f32> = (0..4)
            .map(|rank| shard_weight(&TensorParallel { rank, size: 4 }, &c, w, k.clone()).data[0])
            .collect();
        assert_eq!(heads, vec![0.0, 0.0, 16.0, 16.0]);
    }
}
