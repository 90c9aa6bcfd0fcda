//! The engine in the worker. Methods that await the GPU return promises; the worker calls
//! `add` and `abort` only between steps (it queues the page's messages while a step is in
//! flight), and a call that overlaps a step anyway is refused, never a panic.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use infer_api::RequestError;
use infer_core::backend::Backend;
use infer_core::model::checked_max_model_len;
use infer_core::spec_decode::{SpecMethod, SpeculativeConfig};
use infer_core::{
    Engine, EngineOptions, Model, ModelExecutor, PreemptionMode, SchedulerConfig, Speculation,
};
use infer_wgpu::WgpuBackend;
use serde_json::json;
use wasm_bindgen::prelude::*;

use crate::loader::{js_err, Header, WebLoader};
use crate::session::{Event, Session};
use crate::{BLOCK_SIZE, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, MIN_KV_CACHE_MIB};

struct Inner {
    backend: WgpuBackend,
    model: Arc<Model<WgpuBackend>>,
    session: Session,
    engine: Option<Engine<ModelExecutor<WgpuBackend>>>,
    kv_cache_mib: usize,
    /// Speculative decoding asked for (`set_speculation`), built into the engine by
    /// `allocate`.
    speculation: Option<(SpeculativeConfig, Option<Arc<Model<WgpuBackend>>>)>,
}

#[wasm_bindgen]
pub struct WebEngine {
    inner: Rc<RefCell<Inner>>,
}

fn events_json(events: &[Event]) -> String {
    serde_json::to_string(events).unwrap_or_else(|_| "[]".into())
}

fn busy() -> JsError {
    js_err("the engine is busy with a step: call it between steps")
}

impl Inner {
    fn engine(&mut self) -> Result<&mut Engine<ModelExecutor<WgpuBackend>>, JsError> {
        self.engine
            .as_mut()
            .ok_or_else(|| js_err("no KV cache yet: call allocate first"))
    }
}

#[wasm_bindgen]
impl WebEngine {
    /// Builds the model from the loader's uploaded weights. `max_model_len` 0 keeps the
    /// model's own context (lowered later to what the KV pool holds).
    #[wasm_bindgen(constructor)]
    pub fn new(
        loader: WebLoader,
        model_name: String,
        max_model_len: usize,
    ) -> Result<WebEngine, JsError> {
        let (backend, h, model) = model_from_loader(loader, max_model_len)?;
        let max_len = model.max_model_len();
        let session = Session::new(h.tokenizer, model_name, max_len);
        Ok(WebEngine {
            inner: Rc::new(RefCell::new(Inner {
                backend,
                model: Arc::new(model),
                session,
                engine: None,
                kv_cache_mib: 0,
                speculation: None,
            })),
        })
    }

    /// Speculative decoding from the next `allocate` on: `config` is vLLM's
    /// `speculative_config` JSON (`{"method": "ngram", "num_speculative_tokens": 4}`); a
    /// draft model comes as its own loader (`draft`), streamed like the target, and must share
    /// the target's vocabulary.
    pub fn set_speculation(&self, config: &str, draft: Option<WebLoader>) -> Result<(), JsError> {
        let config: SpeculativeConfig =
            serde_json::from_str(config).map_err(|e| js_err(format!("speculativeConfig: {e}")))?;
        let method = config.method().map_err(js_err)?;
        let mut i = self.inner.try_borrow_mut().map_err(|_| busy())?;
        let draft = match (method, draft) {
            (SpecMethod::Ngram { .. }, None) => None,
            (SpecMethod::Ngram { .. }, Some(_)) => {
                return Err(js_err(
                    "speculativeConfig: method ngram takes no draft model",
                ))
            }
            (SpecMethod::Draft { model }, None) => {
                return Err(js_err(format!(
                    "speculativeConfig: the draft model {model} was not loaded"
                )))
            }
            (SpecMethod::Draft { model: name }, Some(loader)) => {
                let (_, h, draft) = model_from_loader(loader, i.model.max_model_len())?;
                let (dv, tv) = (draft.config().vocab_size, i.model.config().vocab_size);
                let (dt, tt) = (
                    h.tokenizer.vocab_size(),
                    i.session.tokenizer_arc().vocab_size(),
                );
                if dv != tv || dt != tt {
                    return Err(js_err(format!(
                        "speculativeConfig: the draft model {name} has a vocabulary of {dv} \
                         ({dt} in its tokenizer), the target {tv} ({tt}): a draft must share \
                         the target's tokenizer"
                    )));
                }
                Some(Arc::new(draft))
            }
        };
        i.speculation = Some((config, draft));
        Ok(())
    }

    /// Allocates the KV pool: `kv_cache_mib`, halved on each out-of-memory error down to
    /// `MIN_KV_CACHE_MIB` (WebGPU has no free-memory query). Resolves to the pool's figures as
    /// JSON; the context is lowered to what the pool holds.
    pub fn allocate(&self, kv_cache_mib: usize) -> js_sys::Promise {
        let inner = self.inner.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let (backend, model, speculation) = {
                let i = inner.try_borrow().map_err(|_| busy())?;
                (i.backend.clone(), i.model.clone(), i.speculation.clone())
            };
            let element = backend.kv_element_bytes();
            // A draft model keeps a block for every block of the target's pool.
            let draft_bytes = match &speculation {
                Some((_, Some(d))) => d.kv_cache_spec(1, BLOCK_SIZE).bytes_per_block(element),
                _ => 0,
            };
            let spec = model.kv_cache_spec(1, BLOCK_SIZE);
            let block_bytes = spec.bytes_per_block(element) + draft_bytes;
            let mut mib = kv_cache_mib.max(MIN_KV_CACHE_MIB);
            // The core builder sizes the pool and makes the executor; WebGPU cannot report
            // free memory, so an out-of-memory error halves the request instead.
            let (executor, config) = loop {
                let options = EngineOptions {
                    block_size: BLOCK_SIZE,
                    num_kv_blocks: Some((mib << 20) / block_bytes),
                    kv_cache_bytes: 0,
                    kv_cache_bytes_exact: false,
                    gpu_memory_utilization: 1.0,
                    swap_bytes: 0,
                    scheduler: SchedulerConfig {
                        max_num_seqs: MAX_NUM_SEQS,
                        max_num_batched_tokens: MAX_NUM_BATCHED_TOKENS,
                        preemption_mode: PreemptionMode::Recompute,
                    },
                    prefix_caching: true,
                };
                let device = &backend.context().device;
                let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
                let made =
                    options.executor(backend.clone(), model.clone(), false, None, draft_bytes);
                let oom = scope.pop().await;
                match (made, oom) {
                    (Ok(made), None) => break made,
                    (_, Some(err)) if mib / 2 >= MIN_KV_CACHE_MIB => {
                        tracing::warn!(mib, %err, "KV pool did not fit; halving");
                        mib /= 2;
                    }
                    (_, Some(err)) => {
                        return Err(js_err(format!("out of GPU memory: {err}")).into())
                    }
                    (Err(e), None) => return Err(js_err(e).into()),
                }
            };
            let (blocks, max_len) = (config.num_device_blocks, config.max_model_len);
            let mut i = inner.try_borrow_mut().map_err(|_| busy())?;
            let tokenizer = i.session.tokenizer_arc();
            let mut engine = Engine::new(executor, Some(tokenizer), config).map_err(js_err)?;
            if let Some((config_json, draft)) = speculation {
                let speculation = Speculation {
                    config: config_json,
                    draft,
                };
                let speculator = speculation
                    .speculator(backend.clone(), &config)
                    .map_err(js_err)?;
                engine.set_speculator(Some(speculator));
            }
            i.session.set_max_model_len(max_len);
            i.engine = Some(engine);
            i.kv_cache_mib = mib;
            let info = json!({
                "kv_cache_mib": mib,
                "kv_blocks": blocks,
                "block_size": BLOCK_SIZE,
                "max_model_len": max_len,
                "backend": i.backend.name(),
                "speculation": i.speculation.as_ref().map(|(c, _)| c),
            });
            Ok(JsValue::from_str(&info.to_string()))
        })
    }

    /// Adds a request (`endpoint` `chat` or `completion`, `body` OpenAI's JSON). Returns
    /// `{"id", "events"}` or `{"error"}` with OpenAI's error body.
    pub fn add(&self, endpoint: &str, body: &str) -> Result<String, JsError> {
        let mut guard = self.inner.try_borrow_mut().map_err(|_| busy())?;
        let i = &mut *guard;
        i.engine()?;
        let (id, requests, first) = match i.session.prepare(endpoint, body) {
            Ok(p) => p,
            Err(e) => return Ok(json!({"error": e.body_with_status()}).to_string()),
        };
        let engine = i.engine()?;
        for (k, r) in requests.iter().enumerate() {
            if let Err(e) = engine.add_request(r.id.clone(), r.prompt.clone(), r.params.clone()) {
                for added in &requests[..k] {
                    engine.abort_request(&added.id);
                }
                i.session.abort(&id);
                let e = RequestError::from(e).structured_param(r.structured_param);
                return Ok(json!({"error": e.body_with_status()}).to_string());
            }
        }
        Ok(json!({"id": id, "events": first}).to_string())
    }

    /// `tokenize` / `detokenize` (`endpoint`, `body` as `infer serve` takes them): the reply
    /// or `{"error"}` (JSON).
    pub fn tokenizer(&self, endpoint: &str, body: &str) -> Result<String, JsError> {
        let i = self.inner.try_borrow().map_err(|_| busy())?;
        Ok(match i.session.tokenizer_call(endpoint, body) {
            Ok(reply) => reply.to_string(),
            Err(e) => json!({"error": e.body_with_status()}).to_string(),
        })
    }

    /// Aborts a request and frees its KV blocks; returns the events (JSON).
    pub fn abort(&self, id: &str) -> Result<String, JsError> {
        let mut guard = self.inner.try_borrow_mut().map_err(|_| busy())?;
        let i = &mut *guard;
        let ids = i.session.engine_ids(id);
        let engine = i.engine()?;
        for e in &ids {
            engine.abort_request(e);
        }
        Ok(events_json(
            &i.session.abort(id).into_iter().collect::<Vec<_>>(),
        ))
    }

    /// Whether a step has anything to do.
    pub fn has_work(&self) -> bool {
        self.inner
            .try_borrow()
            .is_ok_and(|i| i.engine.as_ref().is_some_and(|e| e.has_unfinished()))
    }

    /// One engine step; resolves to the events it made (JSON). An engine failure fails every
    /// live request with an error event.
    pub fn step(&self) -> js_sys::Promise {
        let inner = self.inner.clone();
        // The borrow is held across the read-back on purpose: a call that overlaps the step
        // gets `busy()` from `try_borrow`, never a panic (the worker queues calls anyway).
        #[allow(clippy::await_holding_refcell_ref)]
        wasm_bindgen_futures::future_to_promise(async move {
            let mut guard = inner.try_borrow_mut().map_err(|_| busy())?;
            let i = &mut *guard;
            let engine = i.engine.as_mut().ok_or_else(|| js_err("no KV cache yet"))?;
            let events = match engine.step_async().await {
                Ok(outputs) => outputs
                    .into_iter()
                    .flat_map(|o| i.session.on_output(o))
                    .collect::<Vec<_>>(),
                Err(e) => {
                    let why = RequestError::new(500, format!("the engine failed: {e}"));
                    let ids = i.session.active_ids();
                    for id in &ids {
                        for e in i.session.engine_ids(id) {
                            engine.abort_request(&e);
                        }
                    }
                    i.session.fail_all(&why)
                }
            };
            Ok(JsValue::from_str(&events_json(&events)))
        })
    }

    /// Engine counters and the KV pool as JSON (`kv_blocks_used` counts distinct blocks held
    /// by live sequences, as `infer serve`'s `/metrics` does).
    pub fn stats(&self) -> Result<String, JsError> {
        let i = self.inner.try_borrow().map_err(|_| busy())?;
        let e = i.engine.as_ref().ok_or_else(|| js_err("no KV cache yet"))?;
        let s = e.stats();
        Ok(json!({
            "steps": s.steps,
            "num_running": s.num_running,
            "num_waiting": s.num_waiting,
            "kv_usage": s.kv_usage,
            "kv_blocks_used": s.kv_blocks_physical,
            "kv_blocks_total": e.scheduler().block_manager().num_device_blocks(),
            "prefix_cache_hit_tokens": s.prefix_cache_hit_tokens,
            "preemptions": s.preemptions,
            "output_tokens": s.output_tokens,
            "prompt_tokens": s.prompt_tokens_computed,
            "last_step_ms": s.last_step_time.as_secs_f64() * 1e3,
            "active_requests": i.session.num_active(),
            "kv_cache_mib": i.kv_cache_mib,
            "spec_decode": s.spec,
        })
        .to_string())
    }
}

/// The model a loader streamed (every weight uploaded), with its context checked against
/// `max_model_len` (0: the model's own).
fn model_from_loader(
    loader: WebLoader,
    max_model_len: usize,
) -> Result<(WgpuBackend, Header, Model<WgpuBackend>), JsError> {
    let WebLoader {
        backend,
        header,
        uploaded,
        ..
    } = loader;
    let h = header.ok_or_else(|| js_err("the loader has no model"))?;
    if uploaded.len() != h.plan.len() {
        return Err(js_err(format!(
            "{} of {} weights uploaded",
            uploaded.len(),
            h.plan.len()
        )));
    }
    let asked = (max_model_len > 0).then_some(max_model_len);
    let max_len = checked_max_model_len(&h.config, asked).map_err(js_err)?;
    let mut weights = uploaded.into_iter();
    let model = Model::from_weights(&backend, &h.config, max_len, h.has_lm_head, &mut |w| {
        weights.next().ok_or_else(|| {
            infer_core::InferError::invalid("weights", format!("{w:?} was not uploaded"))
        })
    })
    .map_err(js_err)?;
    Ok((backend, h, model))
}
