//! The engine thread's embedding path: requests that arrive together are computed as one
//! batch (while a generation keeps the engine stepping), each gets its own vectors back, and
//! a bad input fails only its own request.

use std::sync::Arc;

use infer_core::{
    EmbedParams, Engine, EngineConfig, ModelExecutor, PoolingType, PreemptionMode, SamplingParams,
    SchedulerConfig,
};
use infer_cpu::CpuBackend;
use infer_tests::smollm2_shared;
use infer_web::{AsyncEngine, LoopOptions, Metrics, SubmitError};

fn handle() -> (AsyncEngine, Arc<Metrics>) {
    let (model, tokenizer) = smollm2_shared();
    let config = EngineConfig {
        block_size: 16,
        num_device_blocks: 64,
        num_host_blocks: 0,
        max_model_len: 512,
        enable_prefix_caching: true,
        scheduler: SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            preemption_mode: PreemptionMode::Recompute,
        },
    };
    let metrics = Arc::new(Metrics::new("smol", "infer").unwrap());
    let (engine, ()) = infer_web::start_engine(
        move || {
            let exec = ModelExecutor::new(CpuBackend::new(), model, 16, 64, 0)
                .map_err(|e| e.to_string())?;
            let engine = Engine::new(exec, Some(tokenizer), config).map_err(|e| e.to_string())?;
            Ok((engine, ()))
        },
        LoopOptions::quiet(0),
        metrics.clone(),
    )
    .unwrap();
    (engine, metrics)
}

/// A metric's value (summed over its label sets) in the Prometheus text.
fn metric(metrics: &Metrics, name: &str) -> f64 {
    metrics
        .encode()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn concurrent_embeddings_batch_and_a_bad_input_fails_alone() {
    let (engine, metrics) = handle();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let params = EmbedParams {
        pooling: PoolingType::Mean,
        ..EmbedParams::default()
    };
    let inputs: Vec<Vec<u32>> = (0..6u32)
        .map(|i| {
            (0..(20 + 7 * i))
                .map(|t| 100 + (t * 37 + i) % 4000)
                .collect()
        })
        .collect();
    let alone: Vec<Vec<f32>> = inputs
        .iter()
        .map(|p| {
            rt.block_on(engine.embed(vec![p.clone()], params))
                .unwrap()
                .remove(0)
        })
        .collect();
    // Each answered embedding request counts as a finished one, with its latency and prompt.
    assert_eq!(metric(&metrics, "infer:request_success_total"), 6.0);
    assert_eq!(
        metric(&metrics, "infer:e2e_request_latency_seconds_count"),
        6.0
    );
    let prompt_tokens: usize = inputs.iter().map(Vec::len).sum();
    assert_eq!(
        metric(&metrics, "infer:request_prompt_tokens_sum"),
        prompt_tokens as f64
    );
    rt.block_on(async {
        // A generation keeps the engine thread stepping, so the embeddings queue up behind
        // a step and are taken together.
        let _busy = engine
            .submit("busy".into(), vec![1, 2, 3], SamplingParams::greedy(64))
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for (i, p) in inputs.iter().enumerate() {
            let (engine, p) = (engine.clone(), p.clone());
            tasks.push(tokio::spawn(async move {
                engine.embed(vec![p; (i % 2) + 1], params).await
            }));
        }
        let bad = engine.clone();
        tasks.push(tokio::spawn(async move {
            bad.embed(vec![vec![5, 999_999]], params).await
        }));
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        let failed = results.pop().unwrap();
        match failed {
            Err(SubmitError::Invalid(e)) => assert!(e.to_string().contains("vocabulary"), "{e}"),
            other => panic!("the bad input was not refused: {other:?}"),
        }
        for (i, r) in results.into_iter().enumerate() {
            let vectors = r.unwrap();
            assert_eq!(vectors.len(), (i % 2) + 1);
            for v in vectors {
                let d = v
                    .iter()
                    .zip(&alone[i])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(d < 1e-5, "input {i}: {d}");
            }
        }
    });
    // Six more answered (the failed one is the client's error, not counted); the busy
    // generation may have finished too.
    let finished = metric(&metrics, "infer:request_success_total");
    assert!((12.0..=13.0).contains(&finished), "{finished}");
    engine.shutdown();
}
