//! Kernel benchmarks at SmolLM2-135M's shapes: each kernel is recorded `reps` times into one
//! compute pass, timed with timestamp queries at the pass's start and end where the adapter
//! has `TIMESTAMP_QUERY` (else by the wall clock around submit-and-wait), several times over,
//! and reported as the median with the GFLOP/s and GB/s that implies.

use std::time::Instant;

use crate::context::{lock, GpuContext, GpuResult};
use crate::kernels::{AttentionShape, MatrixRef, WeightStorage};
use crate::pool::GpuBuffer;

/// One kernel at one shape.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelTiming {
    pub kernel: String,
    pub shape: String,
    /// Median time per call, µs.
    pub median_us: f64,
    pub gflops: f64,
    pub gbytes_per_s: f64,
}

/// How the timings were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Clock {
    TimestampQueries,
    WallClock,
}

struct Case<'a> {
    kernel: &'static str,
    shape: String,
    flops: f64,
    bytes: f64,
    run: Box<dyn Fn() -> GpuResult<()> + 'a>,
}

fn random(n: usize, seed: u32) -> Vec<f32> {
    // A cheap LCG: the values only need to be finite and varied.
    let mut s = seed.wrapping_mul(747_796_405).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// A weight of `[rows, cols]` in `storage`, one part.
#[expect(
    clippy::cast_possible_truncation,
    reason = "benchmark shapes are small"
)]
fn weight(ctx: &GpuContext, rows: usize, cols: usize, storage: WeightStorage) -> GpuBuffer {
    let w = random(rows * cols, (rows * 31 + cols) as u32);
    match storage {
        WeightStorage::F32 => ctx.upload_f32(&w),
        WeightStorage::F16 => {
            let h: Vec<u16> = w
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            ctx.upload_bytes(bytemuck::cast_slice(&h))
        }
    }
}

pub struct KernelBench<'a> {
    ctx: &'a GpuContext,
    reps: u32,
    samples: usize,
}

impl<'a> KernelBench<'a> {
    pub fn new(ctx: &'a GpuContext, reps: u32, samples: usize) -> Self {
        KernelBench {
            ctx,
            reps: reps.max(1),
            samples: samples.max(1),
        }
    }

    pub fn clock(&self) -> Clock {
        if self.ctx.features.contains(wgpu::Features::TIMESTAMP_QUERY) {
            Clock::TimestampQueries
        } else {
            Clock::WallClock
        }
    }

    /// Seconds per call of `f`, one sample.
    fn sample(&self, f: &dyn Fn() -> GpuResult<()>) -> GpuResult<f64> {
        let ctx = self.ctx;
        if self.clock() == Clock::WallClock {
            ctx.flush()?;
            ctx.wait_idle()?;
            let t = Instant::now();
            for _ in 0..self.reps {
                f()?;
            }
            ctx.flush()?;
            ctx.wait_idle()?;
            return Ok(t.elapsed().as_secs_f64() / self.reps as f64);
        }
        let queries = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("bench"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let resolved = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        lock(&ctx.recorder).timed_pass(&ctx.device, &queries, 0);
        for _ in 0..self.reps {
            f()?;
        }
        lock(&ctx.recorder)
            .encoder(&ctx.device)
            .resolve_query_set(&queries, 0..2, &resolved, 0);
        let ticks = ctx.read_bytes(&[(&resolved, 0, 16)])?;
        let ticks: &[u64] = bytemuck::cast_slice(&ticks);
        let ns = ticks[1].saturating_sub(ticks[0]) as f64 * ctx.queue.get_timestamp_period() as f64;
        Ok(ns * 1e-9 / self.reps as f64)
    }

    fn time(&self, case: &Case) -> GpuResult<KernelTiming> {
        (case.run)()?; // warm-up: pipeline creation, pool, bind groups
        let mut secs = (0..self.samples)
            .map(|_| self.sample(&*case.run))
            .collect::<GpuResult<Vec<f64>>>()?;
        secs.sort_by(f64::total_cmp);
        let median = secs[secs.len() / 2].max(1e-12);
        Ok(KernelTiming {
            kernel: case.kernel.to_string(),
            shape: case.shape.clone(),
            median_us: median * 1e6,
            gflops: case.flops / median * 1e-9,
            gbytes_per_s: case.bytes / median * 1e-9,
        })
    }

    /// Times every kernel at SmolLM2-135M's shapes (hidden 576, MLP 1536, 9 heads of 64 over
    /// 3 KV heads, vocabulary 49,152): decode (1 and 8 rows), a 128-token prefill chunk, and
    /// 16 sequences attending over 512 cached tokens. `progress` gets each result.
    pub fn run_all(&self, progress: &mut dyn FnMut(&KernelTiming)) -> GpuResult<Vec<KernelTiming>> {
        let ctx = self.ctx;
        let (hidden, mlp, vocab, heads, kv_heads, hd) = (576, 1536, 49_152, 9, 3, 64);
        let prefill = 128;
        let x = ctx.upload_f32(&random(prefill * mlp, 1));
        let y = ctx.upload_f32(&random(prefill * mlp, 2));
        let norm_w = ctx.upload_f32(&random(hidden, 3));
        let weights: Vec<(usize, usize, WeightStorage, GpuBuffer)> = [
            (mlp, hidden, WeightStorage::F32),
            (mlp, hidden, WeightStorage::F16),
            (vocab, hidden, WeightStorage::F16),
        ]
        .into_iter()
        .map(|(n, k, s)| (n, k, s, weight(ctx, n, k, s)))
        .collect();
        let mut cases: Vec<Case> = Vec::new();
        let (x, y, norm_w) = (&x, &y, &norm_w);
        for (n, k, storage, w) in &weights {
            let (n, k, storage) = (*n, *k, *storage);
            let ms: &[usize] = if n == vocab {
                &[1, 8]
            } else {
                &[1, 8, prefill]
            };
            for &m in ms {
                let w_bytes = (n * k * storage.bytes_per_element()) as f64;
                // Decode sizes have two kernels (cooperative, barrier-free): time both.
                let variants: &[(&'static str, bool)] = if m <= infer_shaders::MATMUL_SMALL_MAX_M {
                    &[("matmul_small", false), ("matmul_rows", true)]
                } else {
                    &[("matmul_tiled", false), ("matmul_rows", true)]
                };
                for &(kernel, barrier_free) in variants {
                    cases.push(Case {
                        kernel,
                        shape: format!("{m}x{k} · {n}x{k}ᵀ {storage:?}"),
                        flops: 2.0 * (m * n * k) as f64,
                        bytes: w_bytes + 4.0 * (m * k + m * n) as f64,
                        run: Box::new(move || {
                            let parts = std::slice::from_ref(w);
                            let w = MatrixRef {
                                parts,
                                part_rows: n,
                                rows: n,
                                cols: k,
                                storage,
                            };
                            with_kernels(ctx, barrier_free, || ctx.matmul(x, &w, m).map(drop))
                        }),
                    });
                }
            }
        }
        let (rows, len) = (prefill, prefill * hidden);
        for (kernel, barrier_free) in [("rms_norm", false), ("rms_norm_rows", true)] {
            cases.push(Case {
                kernel,
                shape: format!("{rows}x{hidden}"),
                flops: 4.0 * len as f64,
                bytes: 8.0 * len as f64,
                run: Box::new(move || {
                    with_kernels(ctx, barrier_free, || {
                        ctx.rms_norm(x, norm_w, rows, hidden, 1e-5).map(drop)
                    })
                }),
            });
        }
        let len = prefill * mlp;
        cases.push(Case {
            kernel: "silu_mul",
            shape: format!("{prefill}x{mlp}"),
            flops: 6.0 * len as f64,
            bytes: 12.0 * len as f64,
            run: Box::new(move || {
                ctx.gated_act(x, y, len, crate::kernels::GatedAct::Silu)
                    .map(drop)
            }),
        });
        cases.push(Case {
            kernel: "add_assign",
            shape: format!("{prefill}x{hidden}"),
            flops: (prefill * hidden) as f64,
            bytes: 12.0 * (prefill * hidden) as f64,
            run: Box::new(move || ctx.add_assign(x, y, prefill * hidden)),
        });
        cases.extend(self.model_cases(hidden, vocab, heads, kv_heads, hd, prefill));
        let mut out = Vec::new();
        for case in &cases {
            let t = self.time(case)?;
            progress(&t);
            out.push(t);
        }
        Ok(out)
    }
}

impl KernelBench<'_> {
    /// RoPE, the KV write, attention (decode and a prefill chunk), embedding and argmax; each
    /// case owns its buffers.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "benchmark shapes are small"
    )]
    fn model_cases(
        &self,
        hidden: usize,
        vocab: usize,
        heads: usize,
        kv_heads: usize,
        hd: usize,
        prefill: usize,
    ) -> Vec<Case<'_>> {
        let ctx = self.ctx;
        let mut cases = Vec::new();
        let block_size = 16;
        let q_len = prefill * heads * hd;
        let q = ctx.upload_f32(&random(q_len, 10));
        let positions: Vec<u32> = (0..prefill as u32).collect();
        let positions = ctx.upload_u32(&positions);
        let cos_sin = ctx.upload_f32(&random(4096 * hd, 11));
        cases.push(Case {
            kernel: "rope",
            shape: format!("{prefill} tokens x {heads} heads x {hd}"),
            flops: 3.0 * q_len as f64,
            bytes: 8.0 * q_len as f64 + 4.0 * (prefill * hd) as f64,
            run: Box::new(move || ctx.rope(&q, &positions, &cos_sin, prefill, heads, hd, hd, true)),
        });

        // 16 sequences with 512 cached tokens each (decode), then one 128-token chunk after
        // 384 cached tokens (prefill).
        let (seqs, context) = (16, 512);
        let blocks_per_seq = context / block_size;
        let row = kv_heads * hd;
        let slots = seqs * context;
        let k_cache = ctx.upload_f32(&random(slots * row, 12));
        let v_cache = ctx.upload_f32(&random(slots * row, 13));
        let k_new = ctx.upload_f32(&random(prefill * row, 14));
        let v_new = ctx.upload_f32(&random(prefill * row, 15));
        let slot_ids: Vec<u32> = (0..prefill as u32).map(|i| i * 7 % slots as u32).collect();
        let slot_ids = ctx.upload_u32(&slot_ids);
        let tables: Vec<u32> = (0..(seqs * blocks_per_seq) as u32).collect();
        let tables = ctx.upload_u32(&tables);
        let decode_info: Vec<u32> = (0..seqs as u32)
            .flat_map(|s| [context as u32 - 1, s])
            .collect();
        let decode_info = ctx.upload_u32(&decode_info);
        let prefill_info: Vec<u32> = (0..prefill as u32).flat_map(|t| [384 + t, 0]).collect();
        let prefill_info = ctx.upload_u32(&prefill_info);
        let q_dec = ctx.upload_f32(&random(seqs * heads * hd, 16));
        let q_pre = ctx.upload_f32(&random(prefill * heads * hd, 17));
        let (k_cache, v_cache, tables) = (
            std::sync::Arc::new(k_cache),
            std::sync::Arc::new(v_cache),
            std::sync::Arc::new(tables),
        );
        {
            let (kc, vc) = (k_cache.clone(), v_cache.clone());
            cases.push(Case {
                kernel: "write_kv",
                shape: format!("{prefill} tokens x {row}"),
                flops: 0.0,
                bytes: 16.0 * (prefill * row) as f64,
                run: Box::new(move || {
                    ctx.write_kv(&k_new, &v_new, &slot_ids, &kc, &vc, prefill, row)
                }),
            });
        }
        let shape = move |num_tokens, max_context| AttentionShape {
            num_tokens,
            heads,
            kv_heads,
            head_dim: hd,
            block_size,
            max_blocks: blocks_per_seq,
            max_context,
            scale: 0.125,
            window: None,
            softcap: None,
        };
        let attention_flops =
            move |tokens: usize, keys: f64| 4.0 * tokens as f64 * heads as f64 * keys * hd as f64;
        {
            let (kc, vc, t) = (k_cache.clone(), v_cache.clone(), tables.clone());
            cases.push(Case {
                kernel: "paged_attention",
                shape: format!("decode {seqs} seqs x {context} ctx, {heads}/{kv_heads} heads x {hd}, bs {block_size}"),
                flops: attention_flops(seqs, context as f64),
                bytes: 8.0 * (seqs * context * row) as f64,
                run: Box::new(move || ctx.paged_attention(&q_dec, &kc, &vc, &t, &decode_info, None, shape(seqs, context)).map(drop)),
            });
        }
        cases.push(Case {
            kernel: "paged_attention",
            shape: format!("prefill {prefill} tokens after 384, {heads}/{kv_heads} heads x {hd}"),
            flops: attention_flops(prefill, 384.0 + prefill as f64 / 2.0),
            bytes: 8.0 * (context * row) as f64,
            run: Box::new(move || {
                ctx.paged_attention(
                    &q_pre,
                    &k_cache,
                    &v_cache,
                    &tables,
                    &prefill_info,
                    None,
                    shape(prefill, context),
                )
                .map(drop)
            }),
        });

        let table = weight(ctx, vocab, hidden, WeightStorage::F16);
        let ids: Vec<u32> = (0..prefill as u32)
            .map(|i| i * 383 % vocab as u32)
            .collect();
        let ids = ctx.upload_u32(&ids);
        cases.push(Case {
            kernel: "embedding",
            shape: format!("{prefill} tokens of {vocab}x{hidden} F16"),
            flops: 0.0,
            bytes: 6.0 * (prefill * hidden) as f64,
            run: Box::new(move || {
                let parts = std::slice::from_ref(&table);
                let m = MatrixRef {
                    parts,
                    part_rows: vocab,
                    rows: vocab,
                    cols: hidden,
                    storage: WeightStorage::F16,
                };
                ctx.embedding(&m, &ids, prefill).map(drop)
            }),
        });
        let logits = ctx.upload_f32(&random(seqs * vocab, 18));
        cases.push(Case {
            kernel: "argmax",
            shape: format!("{seqs}x{vocab}"),
            flops: (seqs * vocab) as f64,
            bytes: 4.0 * (seqs * vocab) as f64,
            run: Box::new(move || ctx.argmax(&logits, seqs, vocab).map(drop)),
        });
        cases
    }
}

/// Runs `f` with the barrier-free kernels on or off, then restores the adapter's choice.
fn with_kernels(
    ctx: &GpuContext,
    barrier_free: bool,
    f: impl FnOnce() -> GpuResult<()>,
) -> GpuResult<()> {
    let chosen = ctx.barrier_free_kernels();
    ctx.set_barrier_free_kernels(barrier_free);
    let result = f();
    ctx.set_barrier_free_kernels(chosen);
    result
}
