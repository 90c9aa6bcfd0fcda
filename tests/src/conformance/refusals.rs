//! Bad operands are refused with the same structured error on every backend: the kind (a
//! shape that does not fit, an index out of range, a count), the op and what was wrong, so
//! a caller can tell one from another without reading a message. The inputs are what a bug
//! upstream would hand a backend: a token id past the vocabulary, a slot past the cache, a
//! matrix of the wrong width.

use infer_core::{
    AttentionParams, Backend, BackendError, BatchInput, InferError, KvCacheSpec, RopeStyle,
    SequenceChunk,
};

use super::up;

/// What a refusal says, without the numbers a backend may report differently (the first
/// bad index or the largest).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Shape {
        op: &'static str,
        operands: Vec<&'static str>,
    },
    OutOfRange {
        op: &'static str,
        what: &'static str,
    },
    Count {
        op: &'static str,
        what: &'static str,
    },
}

fn refusal<T>(what: &str, r: infer_core::Result<T>) -> Refusal {
    let Err(e) = r else {
        panic!("{what}: accepted");
    };
    match e {
        InferError::Backend { source, .. } => match source {
            BackendError::Shape { op, operands, .. } => Refusal::Shape {
                op,
                operands: operands.iter().map(|o| o.name).collect(),
            },
            BackendError::OutOfRange { op, what, .. } => Refusal::OutOfRange { op, what },
            BackendError::Count { op, what, .. } => Refusal::Count { op, what },
            other => panic!("{what}: unexpected backend error {other:?}"),
        },
        other => panic!("{what}: not a backend error: {other}"),
    }
}

fn batch(tokens: &[u32], num_computed: usize, table: &[u32], block_size: usize) -> BatchInput {
    let chunk = SequenceChunk {
        tokens,
        num_computed,
        block_table: table,
        want_logits: true,
        all_logits: false,
    };
    BatchInput::build(&[chunk], block_size).expect("a well-formed batch")
}

/// Every refusal below, on `g`; the CPU backend passes the same list.
pub fn check_refusals<B: Backend>(g: &B) {
    let shape = |op, operands: &[&'static str]| Refusal::Shape {
        op,
        operands: operands.to_vec(),
    };
    let range = |op, what| Refusal::OutOfRange { op, what };

    let x = up(g, &[2, 8], &[0.25; 16]);
    let w = up(g, &[3, 6], &[0.5; 18]);
    assert_eq!(
        refusal("matmul", g.matmul(&x, &w)),
        shape("matmul", &["x", "w"])
    );
    let mut sum = up(g, &[2, 8], &[0.25; 16]);
    let other = up(g, &[3, 8], &[0.5; 24]);
    assert_eq!(
        refusal("add_assign", g.add_assign(&mut sum, &other)),
        shape("add_assign", &["x", "y"])
    );
    let norm = up(g, &[3], &[1.5; 3]);
    assert_eq!(
        refusal("rms_norm", g.rms_norm(&x, &norm, 1e-5)),
        shape("rms_norm", &["x", "weight"])
    );
    let up_wide = up(g, &[2, 4], &[0.5; 8]);
    assert_eq!(
        refusal("silu_mul", g.silu_mul(&x, &up_wide)),
        shape("silu_mul", &["gate", "up"])
    );

    // A token id past a vocabulary of 5.
    let table = up(g, &[5, 8], &[0.5; 40]);
    let b = g.upload_batch(&batch(&[1, 7], 0, &[0], 4)).unwrap();
    assert_eq!(
        refusal("embedding", g.embedding(&table, &b)),
        range("embedding", "token id")
    );

    // Positions 3 and 4 against a table of 4 positions.
    let b = g.upload_batch(&batch(&[1, 2], 3, &[0, 1], 4)).unwrap();
    let cos_sin = up(g, &[4, 4], &[0.5; 16]);
    let mut q = up(g, &[2, 8], &[0.25; 16]);
    assert_eq!(
        refusal(
            "rope",
            g.rope(&mut q, &b, &cos_sin, 4, RopeStyle::HalfSplit)
        ),
        range("rope", "position")
    );

    // A cache of 2 blocks of 4 tokens; the sequence's table names block 3.
    let spec = KvCacheSpec {
        num_layers: 1,
        num_blocks: 2,
        block_size: 4,
        num_kv_heads: 1,
        head_dim: 4,
    };
    let mut cache = g.alloc_kv_cache(&spec).unwrap();
    let b = g.upload_batch(&batch(&[1, 2], 0, &[3], 4)).unwrap();
    let kv = up(g, &[2, 4], &[0.5; 8]);
    assert_eq!(
        refusal("write_kv", g.write_kv(&mut cache, 0, &kv, &kv, &b)),
        range("write_kv", "slot")
    );
    assert_eq!(
        refusal("write_kv layer", g.write_kv(&mut cache, 1, &kv, &kv, &b)),
        range("write_kv", "layer")
    );
    let p = AttentionParams {
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 4,
        scale: 0.5,
        window: None,
        softcap: None,
    };
    assert_eq!(
        refusal(
            "paged_attention",
            g.paged_attention(&q, &cache, 0, &b, &p, None)
        ),
        range("paged_attention", "block")
    );
    let sinks = up(g, &[3], &[0.5; 3]);
    assert_eq!(
        refusal(
            "sinks",
            g.paged_attention(&q, &cache, 0, &b, &p, Some(&sinks))
        ),
        Refusal::Count {
            op: "paged_attention",
            what: "sinks"
        }
    );
    assert_eq!(
        refusal("copy_blocks", g.copy_blocks(&mut cache, &[(5, 0)])),
        range("copy_blocks", "source block")
    );

    // The batch wants the logits of its last token (row 1) from a single row.
    let one_row = up(g, &[1, 8], &[0.25; 8]);
    assert_eq!(
        refusal("gather_logit_rows", g.gather_logit_rows(&one_row, &b)),
        range("gather_logit_rows", "row")
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cpu_refuses_bad_operands_with_structured_errors() {
        super::check_refusals(&super::super::cpu());
    }
}
