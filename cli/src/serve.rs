//! `infer serve`: the OpenAI-compatible server. The engine is built and run on its own
//! thread; warp serves on a tokio runtime until SIGINT / SIGTERM.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use infer_web::api::defaults::RequestDefaults;
use infer_web::api::prepare::ChatLimits;
use infer_web::api::reasoning::ReasoningParser;
use infer_web::api::tools::ToolCallParser;
use infer_web::budget::Budget;
use infer_web::cors::parse_list;
use infer_web::{CorsConfig, HttpOptions, LoopOptions, Metrics, ServeOptions, ServerState};

use crate::model::ModelArgs;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Flags from a YAML file (vLLM's): `max-model-len: 4k`, `enable-prefix-caching: true`,
    /// `model: ...`; the command line wins over it.
    #[arg(long, value_name = "FILE.yaml")]
    pub config: Option<std::path::PathBuf>,
    /// Seeds the draws of requests that bring no seed (vLLM's --seed): the same requests in
    /// the same order give the same outputs on every run. Default: fresh entropy.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where default sampling parameters come from (vLLM's): `auto` (the model's
    /// generation_config.json, else its config.json's sampling fields; a GGUF's
    /// `general.sampling.*`), `vllm` (none: OpenAI's defaults), or a folder holding a
    /// generation_config.json. Its temperature, top_p, top_k, min_p and
    /// repetition_penalty fill what requests leave out; max_new_tokens caps every request.
    #[arg(long, default_value = "auto")]
    pub generation_config: String,
    /// JSON over the generation config (vLLM's): '{"temperature": 0.5}'.
    #[arg(long, value_name = "JSON")]
    pub override_generation_config: Option<String>,
    /// Chat-template variables every request gets under its own `chat_template_kwargs`
    /// (vLLM's): '{"enable_thinking": false}'.
    #[arg(long, value_name = "JSON")]
    pub default_chat_template_kwargs: Option<String>,
    /// Read JSON schemas as JSON Schema does: an object allows properties it does not list
    /// unless it says `additionalProperties: false`. Default: as vLLM does, it allows none.
    #[arg(long)]
    pub strict_json_schema: bool,
    /// Split the reasoning of thinking models from their answers (vLLM's): `deepseek_r1`
    /// (DeepSeek-R1, QwQ, Qwen3-Thinking: reasoning up to `</think>`) or `qwen3` (reasoning
    /// when the output opens `<think>`). Chat replies carry it in `reasoning_content`.
    #[arg(long, value_name = "PARSER")]
    pub reasoning_parser: Option<String>,
    #[command(flatten)]
    pub pooling: crate::pooling_args::PoolingArgs,
    /// Render chat requests that bring their own `chat_template` with it (vLLM's; by
    /// default such requests are refused: a template is code the server runs).
    #[arg(long)]
    pub trust_request_chat_template: bool,
    /// No periodic engine line (vLLM's).
    #[arg(long)]
    pub disable_log_stats: bool,
    /// Do not serve the OpenAPI document at /openapi.json (vLLM's: FastAPI's docs off).
    #[arg(long)]
    pub disable_fastapi_docs: bool,
    /// Name logprob tokens `token_id:N` instead of their text, unless a request's
    /// `return_tokens_as_token_ids` says otherwise (vLLM's).
    #[arg(long)]
    pub return_tokens_as_token_ids: bool,
    /// Seconds between engine lines (throughput, queues, KV cache usage, prefix-cache hits).
    #[arg(long, default_value_t = 10.0)]
    pub log_stats_interval: f64,
    /// Log each request as it is admitted: id, prompt length, parameters and prompt ids up
    /// to --max-log-len (vLLM's; off by default).
    #[arg(long, overrides_with = "disable_log_requests")]
    pub enable_log_requests: bool,
    /// Do not log requests (the default; vLLM's).
    #[arg(long, overrides_with = "enable_log_requests")]
    pub disable_log_requests: bool,
    /// Prompt token ids shown per logged request (default: all).
    #[arg(long)]
    pub max_log_len: Option<usize>,
    /// The access log's threshold, as uvicorn's: access lines are `info`, so `warning` and
    /// above hide them.
    #[arg(long, default_value = "info", value_parser = ["critical", "error", "warning", "info", "debug", "trace"])]
    pub uvicorn_log_level: String,
    /// No access log (one line per request: method, path, status, latency, request id).
    #[arg(long)]
    pub disable_uvicorn_access_log: bool,
    /// Paths with no access line, comma-separated (`/health,/metrics`).
    #[arg(long, value_name = "PATHS")]
    pub disable_access_log_for_endpoints: Option<String>,
    /// A path prefix a proxy in front leaves on requests (`/api`): `/api/v1/...` is served
    /// as `/v1/...`.
    #[arg(long)]
    pub root_path: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (leaf first); needs --ssl-keyfile.
    #[arg(long, value_name = "PEM")]
    pub ssl_certfile: Option<std::path::PathBuf>,
    /// The certificate's PEM private key (PKCS#8, PKCS#1 or SEC1); needs --ssl-certfile.
    #[arg(long, value_name = "PEM")]
    pub ssl_keyfile: Option<std::path::PathBuf>,
    /// PEM CAs that sign client certificates (with --ssl-cert-reqs 1 or 2).
    #[arg(long, value_name = "PEM")]
    pub ssl_ca_certs: Option<std::path::PathBuf>,
    /// Client certificates, as Python's `ssl` numbers them: 0 none, 1 optional, 2 required.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub ssl_cert_reqs: u8,
    /// Reload the certificate, key and CA files when they change (new connections get them).
    #[arg(long)]
    pub enable_ssl_refresh: bool,
    /// Every response carries `X-Request-Id` (the request's own, or a fresh one).
    #[arg(long)]
    pub enable_request_id_headers: bool,
    /// Address to bind (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 endpoints.
    #[arg(long, env = "INFER_API_KEY")]
    pub api_key: Option<String>,
    /// Model name clients use (default: the --model value; for an absolute path, its file or
    /// folder name). Several (vLLM's `--served-model-name A B`): the model answers to each,
    /// replies name the first.
    #[arg(long, num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// Waiting requests beyond which new ones get 503 at once (0 = no limit).
    #[arg(long, default_value_t = 256)]
    pub max_waiting: usize,
    /// Prefix of the Prometheus metric names: `vllm` makes `/metrics` read exactly as vLLM's
    /// (`vllm:num_requests_waiting`, ...), for its dashboards and the Kubernetes gateway.
    #[arg(long, default_value = "infer", value_parser = ["infer", "vllm"])]
    pub metrics_prefix: String,
    /// How replies are read for tool calls with `tool_choice: "auto"`: `hermes`
    /// (`<tool_call>{...}</tool_call>`: Hermes, Qwen, and models whose template takes no
    /// tools), `llama3_json` (Llama 3.x), `auto` (from the chat template), `none` (refuse
    /// `auto`; `required` and named functions still work, by grammar).
    #[arg(long, default_value = "auto", value_parser = ["auto", "hermes", "llama3_json", "none"])]
    pub tool_call_parser: String,
    /// Seconds a client has to send a request's headers; idle keep-alive connections are
    /// closed after it too.
    #[arg(long, default_value_t = 10)]
    pub header_read_timeout: u64,
    /// Open connections at most (lowered to fit the open-file limit); more wait to be accepted.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// Seconds in-flight requests get after SIGTERM / SIGINT before they are aborted (a second
    /// signal exits at once).
    #[arg(long, default_value_t = 5)]
    pub shutdown_grace: u64,
    /// CORS: origins allowed to call the API from a browser page (vLLM's flag: a JSON list or
    /// comma-separated; `*` for any). Without it, cross-origin calls are refused.
    #[arg(long)]
    pub allowed_origins: Option<String>,
    /// CORS methods (default with --allowed-origins: GET, HEAD, POST, OPTIONS).
    #[arg(long, default_value = "*")]
    pub allowed_methods: String,
    /// CORS request headers (default: the ones OpenAI clients send).
    #[arg(long, default_value = "*")]
    pub allowed_headers: String,
    /// CORS: allow credentials (cookies, HTTP auth) on cross-origin calls (also vLLM's
    /// --allow-credentials).
    #[arg(long, alias = "allow-credentials")]
    pub allowed_credentials: bool,
    /// The time a step should take when --max-num-batched-tokens is not given: the token
    /// budget follows the measured cost of a token, so long prompts are admitted in chunks
    /// that keep every running stream's gap between tokens near this. 0: no pacing.
    #[arg(long, default_value_t = 250)]
    pub step_target_ms: u64,
    /// Chat messages one request may hold (more: a 400 naming this flag), checked before the
    /// template renders them.
    #[arg(long, default_value_t = ChatLimits::default().max_messages)]
    pub max_chat_messages: usize,
    /// Tools one chat request may hold (OpenAI allows 128).
    #[arg(long, default_value_t = ChatLimits::default().max_tools)]
    pub max_tools: usize,
    /// Requests parsed, rendered and tokenized at once (default: one per core); more wait, up
    /// to 30 s, then get 503. Each costs many times its body while it is prepared.
    #[arg(long)]
    pub max_tokenizing_requests: Option<usize>,
    /// MiB of large (> 64 KiB) request bodies held at once; past it, new ones get 503.
    #[arg(long, default_value_t = infer_web::budget::DEFAULT_BODY_MIB)]
    pub max_body_memory_mib: usize,
    /// vLLM's switch for `tool_choice: "auto"`, accepted so vLLM command lines run: here auto
    /// tool choice is on whenever --tool-call-parser resolves to a parser.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
}

/// The tool-call parser `--tool-call-parser` names, or the chat template's.
fn tool_parser(flag: &str, template: Option<&str>) -> Option<ToolCallParser> {
    let parser = match flag {
        "none" => None,
        "auto" => ToolCallParser::detect(template),
        name => ToolCallParser::from_name(name),
    };
    match parser {
        Some(p) => tracing::info!(parser = p.name(), "tool calls: tool_choice auto reads replies"),
        None if flag == "auto" => tracing::warn!(
            "tool calls: no parser reads this chat template's format; tool_choice auto is refused (pass --tool-call-parser)"
        ),
        None => tracing::info!("tool calls: tool_choice auto is refused (--tool-call-parser none)"),
    }
    parser
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
    // A second signal means now.
    tokio::spawn(async {
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("infer serve: second signal, exiting at once");
        std::process::exit(130);
    });
    #[cfg(unix)]
    if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        tokio::spawn(async move {
            s.recv().await;
            eprintln!("infer serve: second signal, exiting at once");
            std::process::exit(143);
        });
    }
}

fn json_object(flag: &str, text: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => bail!("{flag}: expected a JSON object"),
        Err(e) => bail!("{flag}: not JSON: {e}"),
    }
}

/// Where the server's sampling defaults come from.
enum GenerationSource {
    None,
    /// A generation_config.json, or a config.json holding sampling fields (vLLM's
    /// `GenerationConfig.from_model_config` when there is no generation_config.json).
    Json(std::path::PathBuf),
    /// A GGUF's `general.sampling.*`.
    Gguf(std::path::PathBuf),
}

/// `--generation-config`: `vllm` (none), `auto` (the model's own), or a folder.
fn generation_source(model: &str, flag: &str) -> Result<GenerationSource> {
    match flag {
        "vllm" => Ok(GenerationSource::None),
        "auto" => {
            let path = std::path::Path::new(model);
            // A config.json (`--load-format dummy`) holds the model's own sampling fields.
            if path.is_file() && path.extension().is_some_and(|e| e == "json") {
                return Ok(GenerationSource::Json(path.to_path_buf()));
            }
            // Unresolvable: loading the model reports it.
            let Ok(location) = infer_core::hub::resolve(model) else {
                return Ok(GenerationSource::None);
            };
            Ok(match location {
                infer_core::hub::ModelLocation::Gguf(f) => GenerationSource::Gguf(f),
                infer_core::hub::ModelLocation::HfDir(d) => {
                    match ["generation_config.json", "config.json"]
                        .iter()
                        .map(|n| d.join(n))
                        .find(|f| f.is_file())
                    {
                        Some(f) => GenerationSource::Json(f),
                        None => GenerationSource::None,
                    }
                }
            })
        }
        folder => {
            let f = std::path::Path::new(folder).join("generation_config.json");
            if !f.is_file() {
                bail!("--generation-config {folder}: no generation_config.json there");
            }
            Ok(GenerationSource::Json(f))
        }
    }
}

/// `--generation-config` and `--override-generation-config` (and the default template
/// variables) as the server's request defaults.
fn request_defaults(args: &ServeArgs) -> Result<RequestDefaults> {
    let model = &args.model.model;
    let mut defaults = RequestDefaults::default();
    match generation_source(model, &args.generation_config)? {
        GenerationSource::None => {}
        GenerationSource::Json(f) => {
            let text =
                std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
            let config = json_object(&f.display().to_string(), &text)?;
            defaults = defaults
                .with_generation_config(&config)
                .map_err(|e| anyhow!("{}: {e}", f.display()))?;
        }
        GenerationSource::Gguf(f) => {
            let config = infer_core::gguf::GgufFile::open(&f)?.sampling_defaults()?;
            defaults = defaults
                .with_generation_config(&config)
                .map_err(|e| anyhow!("{}: {e}", f.display()))?;
        }
    }
    if let Some(text) = &args.override_generation_config {
        let config = json_object("--override-generation-config", text)?;
        defaults = defaults
            .with_generation_config(&config)
            .map_err(|e| anyhow!("--override-generation-config: {e}"))?;
    }
    if let Some(d) = defaults.describe() {
        tracing::warn!(
            "default sampling parameters from the generation config: {d} (requests' own values win; --generation-config vllm for none)"
        );
    }
    if let Some(text) = &args.default_chat_template_kwargs {
        defaults.chat_template_kwargs = json_object("--default-chat-template-kwargs", text)?;
    }
    Ok(defaults)
}

/// The HTTP layer's flags.
fn http_options(args: &ServeArgs) -> HttpOptions {
    let quiet = matches!(
        args.uvicorn_log_level.as_str(),
        "critical" | "error" | "warning"
    );
    HttpOptions {
        access_log: (!args.disable_uvicorn_access_log && !quiet).then_some(tracing::Level::INFO),
        access_log_skip: args
            .disable_access_log_for_endpoints
            .iter()
            .flat_map(|s| s.split(','))
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect(),
        root_path: args.root_path.clone(),
        request_id_headers: args.enable_request_id_headers,
    }
}

/// The TLS flags, loaded (a file that does not load stops the start).
fn tls(args: &ServeArgs) -> Result<Option<std::sync::Arc<infer_web::Tls>>> {
    let (certfile, keyfile) = match (&args.ssl_certfile, &args.ssl_keyfile) {
        (Some(c), Some(k)) => (c, k),
        (None, None) => {
            let tls_only = [
                ("--ssl-ca-certs", args.ssl_ca_certs.is_some()),
                ("--ssl-cert-reqs", args.ssl_cert_reqs != 0),
                ("--enable-ssl-refresh", args.enable_ssl_refresh),
            ];
            if let Some((flag, _)) = tls_only.iter().find(|(_, set)| *set) {
                bail!("{flag} needs --ssl-certfile and --ssl-keyfile (TLS)");
            }
            return Ok(None);
        }
        (Some(_), None) => {
            bail!("--ssl-certfile needs --ssl-keyfile (the certificate's private key)")
        }
        (None, Some(_)) => bail!("--ssl-keyfile needs --ssl-certfile (the certificate chain)"),
    };
    let files = infer_web::TlsFiles {
        certfile: certfile.clone(),
        keyfile: keyfile.clone(),
        ca_certs: args.ssl_ca_certs.clone(),
        client_certs: infer_web::ClientCerts::from_reqs(args.ssl_cert_reqs)
            .ok_or_else(|| anyhow!("--ssl-cert-reqs must be 0, 1 or 2"))?,
        refresh: args.enable_ssl_refresh,
    };
    if files.ca_certs.is_some() && files.client_certs == infer_web::ClientCerts::None {
        tracing::warn!("--ssl-ca-certs has no effect with --ssl-cert-reqs 0 (client certificates not asked for)");
    }
    let tls = infer_web::Tls::load(files).map_err(|e| anyhow!("TLS: {e}"))?;
    Ok(Some(tls))
}

/// The --model value, as vLLM names the model; an absolute path is cut to its last part, so
/// routes open without the key (`/metrics` labels) do not disclose where the model lives.
fn default_served_name(model: &str) -> String {
    let path = std::path::Path::new(model);
    match path.file_name().and_then(|n| n.to_str()) {
        Some(name) if path.is_absolute() => name.to_string(),
        _ => model.to_string(),
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    let http = http_options(&args);
    // Before the model loads: a TLS file that does not load should not cost a model load.
    let tls = tls(&args)?;
    let state = build_state(&args)?;
    let backend = state.backend.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    runtime.block_on(async move {
        let addr = SocketAddr::new(args.host, args.port);
        let options = ServeOptions {
            header_read_timeout: Duration::from_secs(args.header_read_timeout.max(1)),
            max_connections: args.max_connections.max(1),
            shutdown_grace: Duration::from_secs(args.shutdown_grace),
            http,
            tls,
            ..ServeOptions::default()
        };
        let (local, server) =
            infer_web::bind_with(state, addr, args.api_key, options, shutdown_signal())
                .await
                .with_context(|| format!("binding {addr}"))?;
        eprintln!("infer serve: {scheme}://{local} ({backend})");
        server.await;
        Ok::<(), anyhow::Error>(())
    })?;
    // Tokenizations still running on the blocking pool are not waited for: the grace period
    // bounds the whole exit (dropping the runtime would wait for them).
    runtime.shutdown_timeout(Duration::from_millis(100));
    Ok(())
}

/// Everything `infer serve` serves from, without a socket: the flags checked, the model
/// loaded and its engine running on its own thread. The Python package serves from the same.
pub fn build_state(args: &ServeArgs) -> Result<Arc<ServerState>> {
    let name = args
        .served_model_name
        .first()
        .cloned()
        .unwrap_or_else(|| default_served_name(&args.model.model));
    let aliases: Vec<String> = args.served_model_name.iter().skip(1).cloned().collect();
    let defaults = request_defaults(args)?;
    let pooling = args
        .pooling
        .params(args.model.parallel.tensor_parallel_size)?;
    if let Some(p) = pooling {
        tracing::info!(
            pooling = %p.pooling,
            normalize = p.normalize,
            "serving an embedding model: /v1/embeddings only"
        );
    }
    let reasoning = match args.reasoning_parser.as_deref() {
        None => None,
        Some(name) => Some(ReasoningParser::from_name(name).ok_or_else(|| {
            anyhow!("--reasoning-parser {name}: infer reads deepseek_r1 and qwen3 (the <think>…</think> formats)")
        })?),
    };
    let model = args.model.clone();
    let gguf = std::path::PathBuf::from(&model.model);
    let gguf = (gguf.extension().is_some_and(|e| e == "gguf") && gguf.is_file()).then_some(gguf);
    let metrics = Arc::new(Metrics::new(&name, &args.metrics_prefix)?);
    let cors = match &args.allowed_origins {
        None => None,
        Some(origins) => Some(CorsConfig {
            origins: parse_list(origins).map_err(|e| anyhow!("--allowed-origins: {e}"))?,
            methods: parse_list(&args.allowed_methods)
                .map_err(|e| anyhow!("--allowed-methods: {e}"))?,
            headers: parse_list(&args.allowed_headers)
                .map_err(|e| anyhow!("--allowed-headers: {e}"))?,
            credentials: args.allowed_credentials,
        }),
    };
    let limits = ChatLimits {
        max_messages: args.max_chat_messages.max(1),
        max_tools: args.max_tools,
        request_templates: args.trust_request_chat_template,
    };
    if args.trust_request_chat_template {
        tracing::warn!(
            "--trust-request-chat-template: requests may bring chat templates, which this server runs (bounded in size, time and output)"
        );
    }
    let budget = Budget::new(
        args.max_body_memory_mib,
        args.max_tokenizing_requests
            .unwrap_or_else(infer_web::budget::default_preparing),
        infer_web::budget::DEFAULT_PREPARE_WAIT,
    );
    if args.enable_auto_tool_choice && args.tool_call_parser == "none" {
        anyhow::bail!("--enable-auto-tool-choice needs a --tool-call-parser other than none");
    }
    if !args.log_stats_interval.is_finite() || args.log_stats_interval <= 0.0 {
        bail!("--log-stats-interval must be a positive number of seconds");
    }
    let loop_options = LoopOptions {
        max_waiting: args.max_waiting,
        log_stats: (!args.disable_log_stats)
            .then(|| Duration::from_secs_f64(args.log_stats_interval)),
        log_requests: args
            .enable_log_requests
            .then(|| args.max_log_len.unwrap_or(usize::MAX)),
    };
    let (seed, strict_schema) = (args.seed, args.strict_json_schema);
    let step_target = (model.engine.max_num_batched_tokens.is_none() && args.step_target_ms > 0)
        .then(|| Duration::from_millis(args.step_target_ms));
    let (engine, (tokenizer, backend, max_model_len)) = infer_web::start_engine(
        move || {
            let (mut engine, tokenizer, backend) = model.engine().map_err(|e| format!("{e:#}"))?;
            engine.set_step_target(step_target);
            engine.set_seed(seed);
            engine.set_strict_json_schema(strict_schema);
            // A pooling server samples nothing: no grammars to prepare.
            if pooling.is_none() {
                if let Err(e) = engine.prepare_structured_outputs() {
                    tracing::warn!("structured outputs and tool choice will fail: {e}");
                }
            }
            let max_model_len = engine.config().max_model_len;
            Ok((engine, (tokenizer, backend, max_model_len)))
        },
        loop_options,
        metrics.clone(),
    )
    .map_err(|e| anyhow!(e))?;
    let parser = match pooling {
        None => tool_parser(&args.tool_call_parser, tokenizer.chat_template()),
        Some(_) => None,
    };
    let state = Arc::new(
        ServerState::new(
            engine,
            tokenizer,
            name,
            max_model_len,
            backend.clone(),
            metrics,
        )
        .with_model_file(gguf)
        .with_tool_parser(parser)
        .with_cors(cors)
        .with_limits(limits, budget)
        .with_defaults(defaults)
        .with_reasoning_parser(reasoning)
        .with_model_aliases(aliases)
        .with_openapi(!args.disable_fastapi_docs)
        .with_token_ids(args.return_tokens_as_token_ids)
        .with_pooling(pooling),
    );
    Ok(state)
}
