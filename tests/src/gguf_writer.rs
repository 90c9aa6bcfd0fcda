//! Writes small GGUF v3 files (F32, F16, Q8_0 tensors) so tests can build models and corrupt them.

use half::f16;
use infer_core::dummy::random_blocks;
use infer_core::gguf::GgmlType;

pub enum Meta {
    U32(u32),
    U64(u64),
    /// An array of bytes (ggml metadata type 0).
    U8s(Vec<u8>),
    F32(f32),
    Str(String),
    Bool(bool),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

pub enum Data {
    F32(Vec<f32>),
    F16(Vec<f32>),
    Q8_0(Vec<f32>),
    /// Raw bytes with an arbitrary ggml type id (for unsupported types).
    Raw(u32, Vec<u8>),
}

#[derive(Default)]
pub struct GgufWriter {
    meta: Vec<(String, Meta)>,
    /// name, row-major shape, data
    tensors: Vec<(String, Vec<usize>, Data)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in values.chunks(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|v| (v * inv).round() as i8 as u8));
    }
    out
}

impl GgufWriter {
    pub fn meta(&mut self, key: &str, value: Meta) -> &mut Self {
        self.meta.retain(|(k, _)| k != key);
        self.meta.push((key.into(), value));
        self
    }

    pub fn tensor(&mut self, name: &str, shape: &[usize], data: Data) -> &mut Self {
        self.tensors.retain(|(n, _, _)| n != name);
        self.tensors.push((name.into(), shape.to_vec(), data));
        self
    }

    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|(n, _, _)| n != name);
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.meta.len() as u64).to_le_bytes());
        for (k, v) in &self.meta {
            put_str(&mut out, k);
            match v {
                Meta::U32(x) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                Meta::U64(x) => {
                    out.extend(10u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                Meta::U8s(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(0u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    out.extend(items);
                }
                Meta::F32(x) => {
                    out.extend(6u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                Meta::Bool(x) => {
                    out.extend(7u32.to_le_bytes());
                    out.push(*x as u8);
                }
                Meta::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    put_str(&mut out, s);
                }
                Meta::Strs(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    items.iter().for_each(|s| put_str(&mut out, s));
                }
                Meta::I32s(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    items.iter().for_each(|x| out.extend(x.to_le_bytes()));
                }
            }
        }
        let blobs: Vec<(u32, Vec<u8>)> = self
            .tensors
            .iter()
            .map(|(_, _, d)| match d {
                Data::F32(v) => (0, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
                Data::F16(v) => (
                    1,
                    v.iter()
                        .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                        .collect(),
                ),
                Data::Q8_0(v) => (8, q8_0(v)),
                Data::Raw(ty, b) => (*ty, b.clone()),
            })
            .collect();
        let mut offset = 0u64;
        for ((name, shape, _), (ty, blob)) in self.tensors.iter().zip(&blobs) {
            put_str(&mut out, name);
            out.extend((shape.len() as u32).to_le_bytes());
            for d in shape.iter().rev() {
                out.extend((*d as u64).to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (blob.len() as u64).div_ceil(32) * 32;
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        for (_, blob) in &blobs {
            out.extend(blob);
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
        }
        out
    }
}

/// Deterministic pseudo-random values in [-scale, scale).
pub fn random_values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A tiny random llama model with a byte-level vocabulary: 2 layers, d=64, GQA 4/2.
pub fn tiny_llama(seed: u64) -> GgufWriter {
    let (d, ff, layers, heads, kv_heads) = (64usize, 96usize, 2usize, 4usize, 2usize);
    let hd = d / heads;
    // Byte-level BPE over the 256 byte symbols plus a few merges and two specials.
    let bytes = byte_level_alphabet();
    let mut tokens: Vec<String> = vec!["<s>".into(), "</s>".into()];
    tokens.extend(bytes.iter().cloned());
    let merges = vec!["h e".to_string(), "l l".into(), "he ll".into()];
    tokens.extend(["he".to_string(), "ll".into(), "hell".into()]);
    let vocab = tokens.len();
    let mut types = vec![1i32; vocab];
    types[0] = 3;
    types[1] = 3;
    let mut w = GgufWriter::default();
    w.meta("general.architecture", Meta::Str("llama".into()))
        .meta("llama.block_count", Meta::U32(layers as u32))
        .meta("llama.context_length", Meta::U32(256))
        .meta("llama.embedding_length", Meta::U32(d as u32))
        .meta("llama.feed_forward_length", Meta::U32(ff as u32))
        .meta("llama.attention.head_count", Meta::U32(heads as u32))
        .meta("llama.attention.head_count_kv", Meta::U32(kv_heads as u32))
        .meta("llama.rope.freq_base", Meta::F32(10000.0))
        .meta("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5))
        .meta("tokenizer.ggml.model", Meta::Str("gpt2".into()))
        .meta("tokenizer.ggml.pre", Meta::Str("smollm".into()))
        .meta("tokenizer.ggml.tokens", Meta::Strs(tokens))
        .meta("tokenizer.ggml.token_type", Meta::I32s(types))
        .meta("tokenizer.ggml.merges", Meta::Strs(merges))
        .meta("tokenizer.ggml.bos_token_id", Meta::U32(0))
        .meta("tokenizer.ggml.eos_token_id", Meta::U32(1));
    let mut k = seed;
    let mut rnd = |n: usize, scale: f32| {
        k += 1;
        random_values(n, k, scale)
    };
    w.tensor(
        "token_embd.weight",
        &[vocab, d],
        Data::F32(rnd(vocab * d, 1.0)),
    );
    w.tensor(
        "output_norm.weight",
        &[d],
        Data::F32(rnd(d, 0.2).iter().map(|x| 1.0 + x).collect()),
    );
    for i in 0..layers {
        let b = |n: &str| format!("blk.{i}.{n}.weight");
        w.tensor(
            &b("attn_norm"),
            &[d],
            Data::F32(rnd(d, 0.2).iter().map(|x| 1.0 + x).collect()),
        );
        w.tensor(
            &b("ffn_norm"),
            &[d],
            Data::F32(rnd(d, 0.2).iter().map(|x| 1.0 + x).collect()),
        );
        w.tensor(
            &b("attn_q"),
            &[heads * hd, d],
            Data::F32(rnd(heads * hd * d, 0.3)),
        );
        w.tensor(
            &b("attn_k"),
            &[kv_heads * hd, d],
            Data::F32(rnd(kv_heads * hd * d, 0.3)),
        );
        w.tensor(
            &b("attn_v"),
            &[kv_heads * hd, d],
            Data::F16(rnd(kv_heads * hd * d, 0.3)),
        );
        w.tensor(
            &b("attn_output"),
            &[d, heads * hd],
            Data::Q8_0(rnd(d * heads * hd, 0.2)),
        );
        w.tensor(&b("ffn_gate"), &[ff, d], Data::F32(rnd(ff * d, 0.2)));
        w.tensor(&b("ffn_up"), &[ff, d], Data::F32(rnd(ff * d, 0.2)));
        w.tensor(&b("ffn_down"), &[d, ff], Data::F32(rnd(d * ff, 0.2)));
    }
    w
}

/// `tiny_llama` with every layer matrix as random `dtype` blocks (`dummy::random_blocks`), for
/// the backends' kernels on packed weights; `dtype`'s block must divide the rows (64 and 96).
pub fn tiny_llama_blocks(seed: u64, dtype: GgmlType) -> GgufWriter {
    let mut w = tiny_llama(seed);
    let id = (0..64)
        .find(|&i| GgmlType::from_id(i) == Some(dtype))
        .expect("a GGUF type id");
    let matrices: Vec<(String, Vec<usize>)> = w
        .tensors
        .iter()
        .filter(|(name, shape, _)| name.starts_with("blk.") && shape.len() == 2)
        .map(|(name, shape, _)| (name.clone(), shape.clone()))
        .collect();
    for (k, (name, shape)) in matrices.into_iter().enumerate() {
        let blocks = random_blocks(dtype, shape[0], shape[1], seed * 100 + k as u64)
            .expect("a type random_blocks makes");
        w.tensor(&name, &shape, Data::Raw(id, blocks));
    }
    w
}

/// GPT-2's byte → unicode mapping, in byte order.
pub fn byte_level_alphabet() -> Vec<String> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut n = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b)
            } else {
                n += 1;
                char::from_u32(255 + n)
            }
            .map(String::from)
            .unwrap_or_default()
        })
        .collect()
}
