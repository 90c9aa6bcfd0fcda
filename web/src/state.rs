//! What every handler shares: the engine handle, the tokenizer, the served model's name and
//! limits, and request ids.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use infer_api::format::Reply;
use infer_api::prepare::{ChatLimits, Served};
use infer_api::tools::ToolCallParser;
use infer_core::Tokenizer;

use crate::budget::Budget;
use crate::cors::CorsConfig;
use crate::engine_loop::AsyncEngine;
use crate::metrics::Metrics;

pub struct ServerState {
    pub engine: AsyncEngine,
    pub tokenizer: Arc<Tokenizer>,
    pub model_name: String,
    pub max_model_len: usize,
    pub backend: String,
    pub metrics: Arc<Metrics>,
    next_id: AtomicU64,
    /// Random per process: replicas started in the same second hand out different ids.
    id_salt: u32,
    pub started: u64,
    /// The GGUF file served, offered to the browser demo at `/browser/model.gguf`.
    pub model_file: Option<std::path::PathBuf>,
    /// How `tool_choice: "auto"` replies are read (`None`: refused).
    pub tool_parser: Option<ToolCallParser>,
    /// CORS (`None`: off).
    pub cors: Option<CorsConfig>,
    /// Bounds on a chat request, checked before it is rendered.
    pub limits: ChatLimits,
    /// What requests leave out (`--generation-config`, `--default-chat-template-kwargs`).
    pub defaults: infer_api::defaults::RequestDefaults,
    /// Other names requests may use for the model (`--served-model-name A B`).
    pub model_aliases: Vec<String>,
    /// Chat replies carry the reasoning apart (`--reasoning-parser`).
    pub reasoning_parser: Option<infer_api::reasoning::ReasoningParser>,
    /// Bodies held and requests prepared at once.
    pub budget: Arc<Budget>,
    /// `GET /openapi.json` is served (`--disable-fastapi-docs` turns it off).
    pub openapi: bool,
    /// `--return-tokens-as-token-ids`: requests' default for logprob token names.
    pub token_ids: bool,
    /// A pooling server (`--runner pooling`): `/v1/embeddings` with this pooling, and no
    /// generation endpoints. `None`: a generating server.
    pub pooling: Option<infer_core::EmbedParams>,
}

/// 32 random bits (std's hasher keys are drawn from the OS per process).
fn random_salt() -> u32 {
    use std::hash::BuildHasher;
    let bits = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    // Any 32 of the 64 bits will do.
    u32::try_from(bits >> 32).unwrap_or_default()
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ServerState {
    pub fn new(
        engine: AsyncEngine,
        tokenizer: Arc<Tokenizer>,
        model_name: String,
        max_model_len: usize,
        backend: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        ServerState {
            engine,
            tokenizer,
            model_name,
            max_model_len,
            backend,
            metrics,
            next_id: AtomicU64::new(0),
            id_salt: random_salt(),
            started: unix_now(),
            model_file: None,
            tool_parser: None,
            cors: None,
            limits: ChatLimits::default(),
            defaults: Default::default(),
            reasoning_parser: None,
            model_aliases: Vec::new(),
            openapi: true,
            token_ids: false,
            pooling: None,
            budget: Budget::new(
                crate::budget::DEFAULT_BODY_MIB,
                crate::budget::default_preparing(),
                crate::budget::DEFAULT_PREPARE_WAIT,
            ),
        }
    }

    /// Other names the model answers to (listed by `/v1/models` after the first).
    pub fn with_model_aliases(mut self, aliases: Vec<String>) -> Self {
        self.model_aliases = aliases;
        self
    }

    /// How chat replies are read for reasoning (`None`: all of it is content).
    pub fn with_reasoning_parser(
        mut self,
        parser: Option<infer_api::reasoning::ReasoningParser>,
    ) -> Self {
        self.reasoning_parser = parser;
        self
    }

    /// Whether `GET /openapi.json` is served.
    pub fn with_openapi(mut self, on: bool) -> Self {
        self.openapi = on;
        self
    }

    /// Logprob tokens as `token_id:N` unless a request says otherwise (vLLM's
    /// `--return-tokens-as-token-ids`).
    pub fn with_token_ids(mut self, on: bool) -> Self {
        self.token_ids = on;
        self
    }

    /// Serves embeddings with `pooling` instead of generating (vLLM's `--runner pooling`).
    pub fn with_pooling(mut self, pooling: Option<infer_core::EmbedParams>) -> Self {
        self.pooling = pooling;
        self
    }

    /// Whether a request's logprob tokens are named `token_id:N`: its own
    /// `return_tokens_as_token_ids`, else the server's.
    pub fn token_ids(&self, asked: Option<bool>) -> bool {
        asked.unwrap_or(self.token_ids)
    }

    /// Defaults for what requests leave out.
    pub fn with_defaults(mut self, defaults: infer_api::defaults::RequestDefaults) -> Self {
        self.defaults = defaults;
        self
    }

    /// Request bounds: chat limits, and the budget of bodies and preparations in flight.
    pub fn with_limits(mut self, limits: ChatLimits, budget: Arc<Budget>) -> Self {
        self.limits = limits;
        self.budget = budget;
        self
    }

    /// Answers cross-origin requests as configured.
    pub fn with_cors(mut self, cors: Option<CorsConfig>) -> Self {
        self.cors = cors;
        self
    }

    /// The tool-call parser for `tool_choice: "auto"`.
    pub fn with_tool_parser(mut self, parser: Option<ToolCallParser>) -> Self {
        self.tool_parser = parser;
        self
    }

    /// Offers a GGUF file to the browser demo (`/browser/model.gguf`).
    pub fn with_model_file(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.model_file = path;
        self
    }

    /// A fresh request id with OpenAI's prefix (`cmpl`, `chatcmpl`).
    pub fn request_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{:08x}{n:06x}", self.started, self.id_salt)
    }

    /// What requests are checked against (model name, tokenizer, context).
    pub fn served(&self) -> Served<'_> {
        Served {
            tokenizer: &self.tokenizer,
            model_name: &self.model_name,
            aliases: &self.model_aliases,
            max_model_len: self.max_model_len,
            tool_parser: self.tool_parser,
            limits: self.limits,
            defaults: &self.defaults,
        }
    }

    /// A reply header (id, time, model) for a fresh request; vLLM's `request_id`, when the
    /// client gives one, makes the id `{prefix}-{request_id}`.
    pub fn reply(&self, prefix: &str, request_id: Option<&str>) -> Reply {
        Reply {
            id: match request_id {
                Some(r) => format!("{prefix}-{r}"),
                None => self.request_id(prefix),
            },
            created: unix_now(),
            model: self.model_name.clone(),
        }
    }
}
