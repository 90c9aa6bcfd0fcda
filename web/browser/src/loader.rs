//! Loading a GGUF model into WebGPU from JavaScript: the worker reads the file in ranges (from
//! the network, the browser's cache or a picked `File`), hands the header to `parse_header`,
//! then each tensor `next_tensor` names to `upload_tensor`, which dequantizes or packs it and
//! uploads it at once, so wasm memory never holds more than one tensor (the config's RoPE
//! factor tensors aside). A fused tensor (Phi-3's `attn_qkv`) is read once per part.

use std::sync::Arc;

use infer_core::config::ModelConfig;
use infer_core::gguf::{GgufFile, CONFIG_TENSORS};
use infer_core::model::upload_weight;
use infer_core::weights::{ModelWeights, WeightName, WeightSource};
use infer_core::{InferError, Model, Tokenizer};
use infer_wgpu::{GpuContext, WeightStorage, WgpuBackend, WgpuTensor};
use wasm_bindgen::prelude::*;

pub(crate) fn js_err(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

/// The parsed model, before its weights are uploaded.
pub(crate) struct Header {
    /// The file under its family's tensor names.
    pub weights: ModelWeights<GgufFile>,
    pub config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub has_lm_head: bool,
    pub plan: Vec<WeightName>,
}

#[wasm_bindgen]
pub struct WebLoader {
    pub(crate) backend: WgpuBackend,
    gguf: Option<GgufFile>,
    /// Config tensors (of `CONFIG_TENSORS`) already handed over.
    config_tensors_kept: Vec<&'static str>,
    pub(crate) header: Option<Header>,
    pub(crate) uploaded: Vec<WgpuTensor>,
}

#[wasm_bindgen]
impl WebLoader {
    /// Opens the browser's WebGPU adapter with its own limits.
    pub async fn open() -> Result<WebLoader, JsError> {
        let ctx = GpuContext::open(wgpu::Backends::BROWSER_WEBGPU, None)
            .await
            .map_err(js_err)?;
        // Packed f16 weights need no `shader-f16` (SwiftShader and many phones lack it).
        let backend = WgpuBackend::with_context(Arc::new(ctx), WeightStorage::F16);
        Ok(WebLoader {
            backend,
            gguf: None,
            config_tensors_kept: Vec::new(),
            header: None,
            uploaded: Vec::new(),
        })
    }

    /// A second loader on the same device (a draft model's: its weights must live where the
    /// target's do).
    pub fn sibling(&self) -> WebLoader {
        WebLoader {
            backend: self.backend.clone(),
            gguf: None,
            config_tensors_kept: Vec::new(),
            header: None,
            uploaded: Vec::new(),
        }
    }

    /// The adapter and the limits that matter here, as JSON.
    pub fn adapter(&self) -> String {
        let ctx = self.backend.context();
        let l = &ctx.limits;
        serde_json::json!({
            "name": ctx.adapter_name(),
            "features": format!("{:?}", ctx.features),
            "max_storage_buffer_binding_size": l.max_storage_buffer_binding_size,
            "max_buffer_size": l.max_buffer_size,
            "max_storage_buffers_per_shader_stage": l.max_storage_buffers_per_shader_stage,
            "max_compute_workgroup_storage_size": l.max_compute_workgroup_storage_size,
            "max_compute_invocations_per_workgroup": l.max_compute_invocations_per_workgroup,
        })
        .to_string()
    }

    /// Parses the header from the file's first bytes; false: it goes on past `prefix`, call
    /// again with more. A file that is not GGUF, truncated or corrupt is an error here.
    pub fn parse_header(
        &mut self,
        name: &str,
        prefix: &[u8],
        file_len: f64,
    ) -> Result<bool, JsError> {
        // A JS number: a whole, non-negative count below 2^53 is exact as u64.
        if !(file_len.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(&file_len)) {
            return Err(JsError::new(&format!(
                "{name}: {file_len} is not a file length"
            )));
        }
        #[expect(clippy::cast_possible_truncation, reason = "a whole number below 2^53")]
        let file_len = file_len as u64;
        match GgufFile::from_header(name, prefix, file_len).map_err(js_err)? {
            None => Ok(false),
            Some(g) => {
                self.gguf = Some(g);
                Ok(true)
            }
        }
    }

    /// The next tensor the config needs before anything else, if any.
    fn next_config_tensor(&self) -> Option<(&'static str, &GgufFile)> {
        let g = self.gguf.as_ref()?;
        CONFIG_TENSORS
            .into_iter()
            .find(|n| g.tensors.contains_key(*n) && !self.config_tensors_kept.contains(n))
            .map(|n| (n, g))
    }

    /// `[start, end)` of the next tensor the config needs before anything else, if any: call
    /// `set_config_tensor` with its bytes until this is `None`.
    pub fn config_tensor_range(&self) -> Option<Vec<f64>> {
        let (name, g) = self.next_config_tensor()?;
        let (a, b) = GgufFile::tensor_range(g.tensors.get(name)?);
        Some(vec![a as f64, b as f64])
    }

    pub fn set_config_tensor(&mut self, bytes: Vec<u8>) -> Result<(), JsError> {
        let name = self
            .next_config_tensor()
            .map(|(n, _)| n)
            .ok_or_else(|| js_err("no config tensor is wanted"))?;
        let g = self
            .gguf
            .as_mut()
            .ok_or_else(|| js_err("no header parsed yet"))?;
        g.keep_tensor(name, bytes).map_err(js_err)?;
        self.config_tensors_kept.push(name);
        Ok(())
    }

    /// Reads the config and tokenizer from the header (an unsupported architecture or quant
    /// type fails here, before any download of weights) and returns the config as JSON.
    pub fn prepare(&mut self) -> Result<String, JsError> {
        let gguf = self
            .gguf
            .take()
            .ok_or_else(|| js_err("no header parsed yet"))?;
        let (config, tokenizer) = gguf.read_model().map_err(js_err)?;
        let tokenizer = Arc::new(tokenizer);
        let file_len = gguf.file_len;
        let weights = ModelWeights::new(gguf, &config);
        let has_lm_head = weights.contains(WeightName::LmHead);
        let plan = Model::<WgpuBackend>::weight_names(&config, has_lm_head);
        for &w in &plan {
            if !weights.contains(w) {
                return Err(js_err(InferError::MissingTensor {
                    name: weights.tensor_name(w),
                    source_name: weights.source_name(),
                }));
            }
        }
        let json = serde_json::json!({
            "architecture": config.architecture,
            "num_layers": config.num_layers,
            "hidden_size": config.hidden_size,
            "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_position_embeddings,
            "weights": plan.len(),
            "file_bytes": file_len,
        })
        .to_string();
        self.header = Some(Header {
            weights,
            config,
            tokenizer,
            has_lm_head,
            plan,
        });
        Ok(json)
    }

    /// `[start, end)` of the next tensor to upload, or `None` when all are up.
    pub fn next_tensor(&self) -> Option<Vec<f64>> {
        let h = self.header.as_ref()?;
        let w = *h.plan.get(self.uploaded.len())?;
        let name = h.weights.locate(w).name;
        let info = h.weights.store.tensors.get(&name)?;
        let (a, b) = GgufFile::tensor_range(info);
        Some(vec![a as f64, b as f64])
    }

    /// Uploads the bytes of the tensor `next_tensor` named, through the native upload path
    /// (packed or dequantized, shape checks); they are dropped once on the device.
    pub fn upload_tensor(&mut self, bytes: Vec<u8>) -> Result<(), JsError> {
        let h = self
            .header
            .as_mut()
            .ok_or_else(|| js_err("call prepare first"))?;
        let w = *h
            .plan
            .get(self.uploaded.len())
            .ok_or_else(|| js_err("every tensor is already uploaded"))?;
        let name = h.weights.locate(w).name;
        h.weights.store.keep_tensor(&name, bytes).map_err(js_err)?;
        let uploaded = upload_weight(&self.backend, &h.weights, &h.config, w);
        h.weights.store.release_tensor(&name);
        let t = uploaded.map_err(js_err)?;
        self.backend.context().take_errors().map_err(js_err)?;
        self.uploaded.push(t);
        Ok(())
    }

    /// (uploaded, total) weights.
    pub fn progress(&self) -> Vec<u32> {
        let total = self.header.as_ref().map_or(0, |h| h.plan.len());
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        vec![count(self.uploaded.len()), count(total)]
    }
}
